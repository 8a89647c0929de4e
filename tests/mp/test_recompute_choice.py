"""The trainer's recompute choice (Trainer(recompute=None), memplan.choose_recompute): the same
bits whether the EncoderBlocks recompute or keep; on MicroPython a roomy heap keeps and free bytes
below the kept plan recompute (tests/mp/recompute_choice_mp.py); under CPython the choice against
the declared plan (cache_floats)."""
import pytest

import helpers

SCRIPT = helpers.script("recompute_choice_mp.py")


def test_same_bits_cpython(backend):
    out = helpers.run_cpython(SCRIPT, backend)
    assert "BITS OK" in out, out


@pytest.mark.parametrize("kernels", ["viper", "python"])
def test_same_bits_and_choice_micropython(micropython, kernels):
    out = helpers.run_micropython(SCRIPT, kernels, exe=micropython, heap="4M")
    assert "BITS OK" in out, out
    assert "CHOICE keep recompute" in out, out
    assert "activations kept (no recompute)" in out, out


def _trainer(flag=None):
    import microformer as mf
    from microformer.train import Trainer
    mf.seed(3)
    m = mf.Sequential([mf.Reshape((6, 4)), mf.Dense(4, 16), mf.EncoderBlock(16, 2, 32),
                       mf.EncoderBlock(16, 2, 32), mf.GlobalAvgPool(), mf.Dense(16, 3)])
    return Trainer(m, mf.CrossEntropyLoss(), None, 8, None, (6, 4), 1e-3, recompute=flag)


def test_choice_against_the_declared_plan():
    """Keep when the free bytes cover the plan with every buffer kept, recompute one byte below;
    the user's setting whatever the free bytes; the declared activations differ by what a block
    keeps: per block the FFN's activation output [B,S,hidden] and one pre-norm LayerNorm output [B,S,E]."""
    from microformer import memplan
    t = _trainer()
    keep = t.plan(8, 8, False, False)
    again = t.plan(8, 8, False, True)
    assert keep["recompute"] is False and again["recompute"] is True
    assert keep["activations"] - again["activations"] == 4 * 2 * (8 * 6 * 32 + 8 * 6 * 16)
    need = memplan.fits_need(keep, memplan.held(t))
    assert memplan.choose_recompute(t, 8, 8, need) is False
    assert all(b.recompute is False for b in memplan.blocks(t.model))
    assert memplan.choose_recompute(t, 8, 8, need - 1) is True
    assert all(b.recompute is True for b in memplan.blocks(t.model))
    assert memplan.choose_recompute(t, 8, 8, None) is False          # no heap to measure: keep
    assert memplan.choose_recompute(_trainer(True), 8, 8, 10 ** 9) is True
    assert memplan.choose_recompute(_trainer(False), 8, 8, 1) is False
    assert "kept, no recompute" in memplan.plan_text(keep)
    assert "recomputed in backward" in memplan.plan_text(again)


def test_recompute_is_checked():
    import microformer as mf
    with pytest.raises(ValueError, match="recompute must be None, True or False, got 1"):
        _trainer(1)
    with pytest.raises(ValueError, match="EncoderBlock: recompute must be True or False"):
        mf.EncoderBlock(16, 2, 32).recompute = "no"
