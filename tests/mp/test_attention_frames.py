# tests/mp/test_attention_frames.py: the viper backend's attention entry points allocate nothing per
# call, on both MicroPython ports, and a decoding step allocates no more than the one heap frame its
# attention kernel's call needs. A bytecode function whose arguments, locals and stack exceed 11
# words gets its frame from the GC heap on every call (a cost that grows with the garbage left
# since the last collection); the entry points are viper functions that call the viper kernels
# directly, so a training step or a decode step through them takes no heap frame of theirs.
import os
import re
import sys

import helpers

sys.path.insert(0, os.path.join(helpers.ROOT, "host", "tools"))
import frames  # noqa: E402


def test_attention_kernels_take_no_heap_frame(micropython):
    out = helpers.run_micropython(helpers.script("attention_frames_mp.py"), heap="2M", exe=micropython)
    assert "DONE" in out, out
    got = dict((m.group(1), int(m.group(2))) for m in re.finditer(r"^ALLOC (.+) (\d+)$", out, re.M))
    assert len(got) == 7, out
    assert all(n == 0 for n in got.values()), "bytes allocated by 10 calls: %r" % got


# a function of `words` words (its arguments and one word of stack), and the bytes one call of it
# allocates, measured at module level (a function calling it would take a heap frame of its own)
_PROBE = """import micropython


def _p(%s):
    return a0


t0 = micropython.mem_total()
for _ in range(100):
    _p(%s)
BYTES = (micropython.mem_total() - t0) / 100
"""


def test_a_decode_step_allocates_one_kernel_frame(tmp_path, micropython):
    # The bound: attndecode._decode_attend passes attention_decode its 10 arguments, which need 12
    # words of value stack, so its frame (host/tools/frames.py) is above the limit and comes from the
    # heap once per step. Every other function a step runs through, in every layer of the stack,
    # stays within the limit and allocates nothing. So a step allocates at most what one call of a
    # function with a frame of that size allocates, measured in the same interpreter (a probe with
    # words - 1 arguments: its frame is its arguments plus one word of stack).
    words = dict((n, w) for n, _, _, w in frames.frames(os.path.join(helpers.ROOT, "lib", "microformer",
                                                                      "attndecode.py")))["_decode_attend"]
    assert words > frames.LIMIT, words            # (none at all once the kernel takes fewer arguments)
    args = ", ".join("a%d" % i for i in range(words - 1))
    (tmp_path / "frame_probe.py").write_text(_PROBE % (args, ", ".join("0" * (words - 1))))
    got = dict((n, w) for n, _, _, w in frames.frames(str(tmp_path / "frame_probe.py")))
    assert got["_p"] == words, got
    out = helpers.run_micropython(helpers.script("decode_step_heap_mp.py"), tmp_path, "frame_probe",
                                  heap="2M", exe=micropython)
    step = float(re.search(r"^STEP (\S+)$", out, re.M).group(1))
    probe = float(re.search(r"^PROBE (\S+)$", out, re.M).group(1))
    assert probe > 0, out
    assert step <= probe, "a decode step allocates %.1f bytes; one heap frame of %d words is %.1f" % (
        step, words, probe)
