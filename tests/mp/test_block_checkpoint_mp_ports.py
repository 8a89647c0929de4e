"""EncoderBlock.checkpoint on both interpreters and every backend: tests/mp/block_checkpoint_mp.py
(outputs and every gradient bit for bit those without it; the blocks' parts keep no forward
arrays of their own; on viper a steady step allocates no more than without it). The switch's checks: tests/unit/test_block_checkpoint.py."""
import pytest

import helpers

SCRIPT = helpers.script("block_checkpoint_mp.py")


def test_block_checkpoint_cpython(backend):
    out = helpers.run_cpython(SCRIPT, backend)
    assert "BLOCK CHECKPOINT OK 2 (%s)" % backend in out, out


@pytest.mark.parametrize("kernels", ["viper", "python"])
def test_block_checkpoint_micropython(micropython, kernels):
    out = helpers.run_micropython(SCRIPT, kernels, exe=micropython)
    n = 3 if kernels == "viper" else 2            # viper: the steady step's allocation too
    assert "BLOCK CHECKPOINT OK %d (%s)" % (n, kernels) in out, out
