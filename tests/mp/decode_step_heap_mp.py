"""The MicroPython side of tests/mp/test_attention_frames.py::test_a_decode_step_allocates_one_kernel_frame:
heap bytes (micropython.mem_total: every allocation, freed or not, heap frames included) per
decode step of the bench's decode stack (board/benchmarks/bench.py decode_setup: Embedding ->
PositionalEncoding -> EncoderBlock -> LayerNorm -> Dense), over the steps after a prompt's first
(after a warm-up round), next to the bytes per call of a function whose frame is the size the test chose (the probe module,
made by the test and passed by name, measures that when imported: PROBE).

    MICROPYPATH=lib:board:board/demos:board/benchmarks micropython tests/mp/decode_step_heap_mp.py DIR PROBE_MODULE
"""
import sys

import micropython

import bench
import microformer as mf

sys.path.append(sys.argv[1])
probe = __import__(sys.argv[2])
model, prompt, x, argmax = bench.decode_setup("viper")
P, V, NEW = bench.DECODE_PROMPT, bench.DECODE_V, bench.DECODE_NEW


def steps(n, count):
    # a prefill and a first step (each layer switches its buffers from the prompt's shape back to
    # one token's: a cost per prompt, not per token), then n greedy steps; with count, the bytes
    # those n steps allocate (the greedy pick included)
    logits = mf.prefill(model, prompt)
    nxt = argmax(logits.data, (P - 1) * V, V)
    x.data[0] = nxt
    logits = mf.decode_step(model, x)
    nxt = argmax(logits.data, 0, V)
    t0 = micropython.mem_total()
    for _ in range(n):
        x.data[0] = nxt
        logits = mf.decode_step(model, x)
        nxt = argmax(logits.data, 0, V)
    return micropython.mem_total() - t0 if count else 0


steps(NEW - 1, False)                             # buffers, kept weights and scratch made here
empty = steps(0, True)                            # the loop's own cost without a step
print("STEP", (steps(NEW - 1, True) - empty) / (NEW - 1))
print("PROBE", probe.BYTES)
