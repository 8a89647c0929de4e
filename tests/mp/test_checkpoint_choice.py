"""The memory plan's checkpoint switch (Trainer(checkpoint=None), memplan.checkpoint_if_needed):
the same bits with EncoderBlock.checkpoint on, off or chosen; on MicroPython free bytes between the
checkpointed plan and the other switch the blocks on for the fit (also with micro_batch='auto'),
say so, and switch them back off after it (tests/mp/checkpoint_choice_mp.py)."""
import pytest

import helpers

SCRIPT = helpers.script("checkpoint_choice_mp.py")


def test_same_bits_cpython(backend):
    out = helpers.run_cpython(SCRIPT, backend)
    assert "CKPT BITS OK" in out, out


def test_same_bits_and_choice_micropython(micropython):
    # viper only: the choice does not depend on the kernels, and a dozen fits on the portable
    # kernels take minutes (their bits: test_same_bits_cpython)
    out = helpers.run_micropython(SCRIPT, "viper", exe=micropython, heap="4M")
    assert "CKPT BITS OK" in out and "CKPT CHOICE OK" in out, out
    assert "CKPT FIT OK 8" in out and out.count("CKPT FIT OK 1") == 2, out
    assert out.count("EncoderBlock.checkpoint on (the plan without it does not fit)") == 4, out
    assert "CKPT NOPROBE OK 8" in out, out


def test_checkpoint_is_checked():
    import microformer as mf
    from microformer.train import Trainer
    m = mf.Sequential([mf.Reshape((6, 4)), mf.EncoderBlock(4, 2, 8), mf.GlobalAvgPool(), mf.Dense(4, 3)])
    with pytest.raises(ValueError, match="Trainer: checkpoint must be None, True or False, got 1"):
        Trainer(m, mf.CrossEntropyLoss(), checkpoint=1)
