"""The shared scratch arena (layer.Scratch, Buffers.scratch): blocks share their backward buffers.

tests/mp/scratch_mp.py holds the checks (bit-identical gradients against every buffer an array of
its own, over pre-norm and post-norm blocks, LoRA and frozen parts, batch sizes that change; the
arena smaller than the own buffers; no placement per steady-state step; no frame left open by an
interrupted backward; one block or three hold the same arena; a frozen Dense keeps its input by
reference and no buffer but its output; a block's dropouts' input gradients are the arena's, the FFN's dropout
backward runs in place); it runs under CPython and inside MicroPython and raises on the first failure.
"""
import pytest

import helpers

SCRATCH = helpers.script("scratch_mp.py")


def test_scratch_cpython(backend):
    out = helpers.run_cpython(SCRATCH, backend)
    assert "SCRATCH OK 12 (%s)" % backend in out, out


@pytest.mark.parametrize("kernels", ["viper", "python"])
def test_scratch_micropython(micropython, kernels):
    out = helpers.run_micropython(SCRATCH, kernels, exe=micropython)
    assert "SCRATCH OK 12 (%s)" % kernels in out, out
