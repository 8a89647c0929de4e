"""Heap the user feels, inside MicroPython (both interpreters, viper backend):
- train.fit on Iris over whole epochs, each ending with a smaller batch (board/bench.py fitheap:
  the figure make bench reports), allocates < 1 KB per step: a smaller batch runs on views of the
  largest batch's buffers, a batch shape seen before gets its buffers back;
- a buffer switch cut short by a KeyboardInterrupt at any buffer it draws or zeroes leaves the
  model usable, with the weights of the steps counted (tests/fit_heap_mp.py);
- greedy decoding through the KV cache (the decode stack of board/bench.py) allocates < 1 KB per
  token.
"""
import re

import helpers


def test_fit_heap_per_step(micropython):
    out = helpers.run_micropython(str(helpers.ROOT) + "/board/bench.py", "fitheap", "viper",
                                  heap="8M", exe=micropython)
    m = re.search(r"^FITHEAP viper (\d+) (\S+) (\d+) (\d+) (\d+)$", out, re.M)
    assert m, out
    steps, per, epochs, rows, batch = int(m.group(1)), float(m.group(2)), int(m.group(3)), int(m.group(4)), int(m.group(5))
    assert epochs >= 2 and rows % batch, "the measure must span whole epochs with a partial batch: %s" % m.group(0)
    assert steps == epochs * ((rows + batch - 1) // batch), m.group(0)
    assert 0 <= per < 1024, "train.fit: %.0f B per step (%d steps, %d epochs of %d rows, batch %d)" % (
        per, steps, epochs, rows, batch)


def test_switch_interrupted_anywhere(micropython):
    out = helpers.run_micropython(helpers.TESTS + "/fit_heap_mp.py", "viper", heap="4M", exe=micropython)
    for kind in ("draw", "zero"):
        m = re.search(r"^SWITCH %s (\d+) (\d+)$" % kind, out, re.M)
        assert m and int(m.group(1)) > 0 and int(m.group(2)) > 0, out


def test_decode_heap_per_token(micropython):
    out = helpers.run_micropython(str(helpers.ROOT) + "/board/bench.py", "decode", "viper", "gelu", "1",
                                  heap="8M", exe=micropython)
    m = re.search(r"^DECODE viper gelu (\S+) (\S+) ", out, re.M)
    assert m, out
    per_token = float(m.group(2))
    assert 0 <= per_token < 1024, "decode: %.0f B per token" % per_token
