"""Heap the user feels, inside MicroPython (both interpreters, viper backend):
- greedy decoding through the KV cache (the decode stack of board/bench.py) allocates < 1 KB per
  token.
"""
import re

import helpers


def test_decode_heap_per_token(micropython):
    out = helpers.run_micropython(str(helpers.ROOT) + "/board/bench.py", "decode", "viper", "gelu", "1",
                                  heap="8M", exe=micropython)
    m = re.search(r"^DECODE viper gelu (\S+) (\S+) ", out, re.M)
    assert m, out
    per_token = float(m.group(2))
    assert 0 <= per_token < 1024, "decode: %.0f B per token" % per_token
