# tests/mp/test_attention_frames.py: the viper backend's attention entry points allocate nothing per
# call, on both MicroPython ports. A bytecode function whose arguments, locals and stack exceed 11
# words gets its frame from the GC heap on every call (a cost that grows with the garbage left
# since the last collection); the entry points are viper functions that call the viper kernels
# directly, so a training step or a decode step through them takes no heap frame.
import re

import helpers


def test_attention_kernels_take_no_heap_frame(micropython):
    out = helpers.run_micropython(helpers.script("attention_frames_mp.py"), heap="2M", exe=micropython)
    assert "DONE" in out, out
    got = dict((m.group(1), int(m.group(2))) for m in re.finditer(r"^ALLOC (.+) (\d+)$", out, re.M))
    assert len(got) == 6, out
    assert all(n == 0 for n in got.values()), "bytes allocated by 10 calls: %r" % got
