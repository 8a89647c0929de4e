"""The bench's decode stack (board/benchmarks/bench.py decode_setup: Embedding -> PositionalEncoding ->
EncoderBlock -> LayerNorm -> Dense, a 16-token prompt) prefills and decodes in a board's 512K heap
on the 32-bit port (objects, ints and floats of an ESP32's sizes), and picks the same tokens there
as in a 16 MB heap: a small heap changes where arrays are placed, never what they compute."""
import pytest

import helpers

pytestmark = pytest.mark.mp32


def _run(exe, heap, new):
    out = helpers.run_micropython(helpers.script("decode_heap_mp.py"), new, 2, heap=heap, exe=exe)
    tokens = [l.split()[1:] for l in out.splitlines() if l.startswith("TOKENS ")]
    heaps = dict((l.split()[1], int(l.split()[2])) for l in out.splitlines() if l.startswith("HEAP "))
    assert len(tokens) == 2 and len(tokens[0]) == new + 1, out
    return tokens, heaps


def test_decode_stack_runs_in_512k_with_the_tokens_of_a_large_heap():
    exe = helpers.need_interpreter("mp32")
    new = 48
    small, heaps = _run(exe, helpers.board_heap(exe, 512), new)
    large, _ = _run(exe, "16M", new)
    assert small == large, "512K: %s\n16M: %s" % (small, large)
    assert small[0] == small[1], "a second prompt (the first one's buffers reused) decoded otherwise"
    assert len(set(small[0])) > 1, small[0]          # a degenerate run would prove little
    assert heaps["decode"] < 512 * 1024, heaps
