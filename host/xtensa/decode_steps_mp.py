# argv[1] cached decode steps on board/benchmarks/bench.py's decode stack (viper), after one prefill and one
# warm-up round: what host/xtensa/insns.py counts instructions of (two runs, different step counts)
import sys

import bench

n = int(sys.argv[1])
model, prompt, x, argmax = bench.decode_setup("viper")
V = bench.DECODE_V


def steps(k):
    logits = bench.mf.prefill(model, prompt)
    nxt = argmax(logits.data, (bench.DECODE_PROMPT - 1) * V, V)
    for _ in range(k):
        x.data[0] = nxt
        logits = bench.mf.decode_step(model, x)
        nxt = argmax(logits.data, 0, V)
    return nxt


steps(4)                      # buffers and caches are allocated here
bench.gc.collect()
print("DECODE-STEPS", n, steps(n))
