"""The viper attention backward of a large item in pieces of query rows, and what it changes for
an Attention layer.

tests/mp/attention_rows_mp.py holds the checks: the rows path's dq, dk, dv bit for bit those of
the one-block path (masked, causal, 1 to 4 heads, one-row pieces), its scratch one piece instead
of the block; weights() and stages() refused after a backward; a second backward of one forward
gives the first one's gradients again (the weights computed again). The dropped weights'
backward keeps one block of scratch (the forward's), not two. The kernel checks run inside
MicroPython (viper); the layer checks on every backend.
"""
import pytest

import helpers

ROWS = helpers.script("attention_rows_mp.py")


@pytest.mark.parametrize("kernels", ["viper", "python"])
def test_attention_rows_micropython(micropython, kernels):
    out = helpers.run_micropython(ROWS, kernels, exe=micropython)
    assert "ATTENTION ROWS OK %d (%s)" % (7 if kernels == "viper" else 0, kernels) in out, out


def test_attention_rows_cpython(backend):
    out = helpers.run_cpython(ROWS, backend)
    assert "ATTENTION ROWS OK 0 (%s)" % backend in out, out
