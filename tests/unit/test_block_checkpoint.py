"""EncoderBlock.checkpoint: the parts' forward buffers in the scratch arena, the forward run again
in backward. Outputs, input gradients and every parameter gradient must be bit-identical to the
block without it (the same kernels on the same inputs), the parts must keep no forward buffers of
their own, and the switch refuses what it cannot do."""
import pytest

import microformer as mf
from microformer import layer as L
from block_cases import model as _model, own_forward_floats as _own_fwd, run as _run


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_checkpoint_bit_identical(lora):
    L.scratch.free()
    want = _run(_model(lora, False))
    L.scratch.free()
    got = _run(_model(lora, True))
    assert len(got) == len(want) and got == want


def test_checkpoint_parts_keep_no_forward_buffers():
    kept = []
    for ck in (False, True):
        L.scratch.free()
        m = _model(True, ck)
        _run(m)
        kept.append(sum(4 * _own_fwd(p) for b in m.layers[:2] for p in b.sublayers()))
    # without: Q K V, the attention weights, the FFN's hidden, the LayerNorms' statistics ...
    assert kept[0] > 3 * 5 * 32 * 4 and kept[1] == 0


def test_checkpoint_switch():
    assert mf.EncoderBlock(16, 2, 32).checkpoint is False
    x = mf.Tensor.zeros((1, 4, 16))
    b = mf.EncoderBlock(16, 2, 32, norm_first=False)
    with pytest.raises(ValueError, match="norm_first=True"):
        b.checkpoint = True
    assert b.checkpoint is False
    b = mf.EncoderBlock(16, 2, 32, dropout=0.1)
    b.checkpoint = True
    with pytest.raises(ValueError, match="dropout=0"):
        b.forward(x)
    b.eval()
    b.forward(x)                      # no dropout in eval mode
    b = mf.EncoderBlock(16, 2, 32)
    with pytest.raises(ValueError, match="True or False, got 1"):
        b.checkpoint = 1
    assert b.checkpoint is False


@pytest.mark.parametrize("first", [True, False], ids=["on-off", "off-on"])
def test_checkpoint_switched_after_steps(first):
    # buffers placed for one setting are not used under the other: the same bits as a model
    # that always ran with the second setting
    L.scratch.free()
    want = _run(_model(True, not first))
    L.scratch.free()
    m = _model(True, first)
    _run(m)
    for b in m.layers[:2]:
        b.checkpoint = not first
    for _, g in m.collect_params([]):
        g.data[:] = g.data.__class__("f", [0.0] * len(g.data))
    assert _run(m) == want


def test_checkpoint_attention_weights_refused():
    # the weights sit in the arena the next block overwrites: weights() and stages() say so
    # instead of showing another block's values; without checkpoint they are there again
    L.scratch.free()
    m = _model(False, True)
    x = mf.Tensor.zeros((1, 5, 16))
    m.forward(x)
    for what in ("weights", "stages"):
        with pytest.raises(ValueError, match="checkpointed EncoderBlock"):
            getattr(m.layers[0].attn, what)()
    m.layers[0].checkpoint = False
    m.forward(x)
    assert len(m.layers[0].attn.weights()) == 5


@pytest.mark.parametrize("recompute", [True, False], ids=["recompute", "kept"])
def test_checkpoint_ffn_reads_the_forward_activation(recompute):
    # the backward's forward left the activation's output in the frame: the FFN computes it
    # neither again (no _h of its own) nor keeps a hidden gradient apart from it (fc2's input
    # gradient written over it: no [.., hidden] backward buffer of the second linear), whether
    # the FFN recomputes its activation (blk.ffn.recompute) or keeps it; the same bits as without
    L.scratch.free()
    m = _model(True, False)
    for b in m.layers[:2]:
        b.ffn.recompute = recompute
    want = _run(m)
    L.scratch.free()
    m = _model(True, True)
    for b in m.layers[:2]:
        b.ffn.recompute = recompute
    assert _run(m) == want
    for b in m.layers[:2]:
        assert "_bwd" not in (getattr(b.ffn, "_stages", None) or {})
        assert "_bwd" not in (getattr(b.ffn.fc2, "_stages", None) or {})
