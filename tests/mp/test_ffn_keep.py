"""What an EncoderBlock's FeedForward keeps for backward: its activation output is computed again
in backward (FeedForward.recompute, a block's default but for tanh and sigmoid) and the second
linear's input gradient is written over it (Dense.backward_over_input).

tests/mp/ffn_keep_mp.py holds the checks (every activation kind, pre-norm and post-norm, full,
LoRA, a frozen second linear, dropout: outputs and every gradient bit for bit those of the kept
output; B*S*hidden fewer floats in the layers' own arrays, fewer with the arena too; cache_floats
says so); it runs under CPython and inside MicroPython and raises on the first failure.
"""
import pytest

import helpers

SCRIPT = helpers.script("ffn_keep_mp.py")


def test_ffn_keep_cpython(backend):
    out = helpers.run_cpython(SCRIPT, backend)
    assert "FFN KEEP OK 62 (%s)" % backend in out, out


@pytest.mark.parametrize("kernels", ["viper", "python"])
def test_ffn_keep_micropython(micropython, kernels):
    out = helpers.run_micropython(SCRIPT, kernels, exe=micropython)
    assert "FFN KEEP OK 62 (%s)" % kernels in out, out
