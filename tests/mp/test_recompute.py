"""Attention.recompute: the weights of one batch item kept, each item's computed again in backward.

tests/mp/recompute_mp.py holds the checks (outputs, input gradients and every parameter gradient
bit for bit those of the stored path: causal or not, lengths, a padding mask with an all-padded
row, alone and inside an EncoderBlock, a batch size that changes; weights() refused; the flag
switched off brings the stored weights back); it runs under CPython and inside MicroPython.
"""
import pytest

import helpers

RECOMPUTE = helpers.script("recompute_mp.py")


def test_recompute_cpython(backend):
    out = helpers.run_cpython(RECOMPUTE, backend)
    assert "RECOMPUTE OK 12 (%s)" % backend in out, out


@pytest.mark.parametrize("kernels", ["viper", "python"])
def test_recompute_micropython(micropython, kernels):
    out = helpers.run_micropython(RECOMPUTE, kernels, exe=micropython)
    assert "RECOMPUTE OK 12 (%s)" % kernels in out, out
