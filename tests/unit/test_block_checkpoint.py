"""EncoderBlock.checkpoint: the parts' forward buffers in the scratch arena, the forward run again
in backward. Outputs, input gradients and every parameter gradient must be bit-identical to the
block without it (the same kernels on the same inputs), the parts must keep no forward buffers of
their own, and the switch refuses what it cannot do."""
import pytest

import microformer as mf
from microformer import layer as L


def _model(lora, ck, norm_first=True, dropout=0.0):
    mf.seed(5)
    m = mf.Sequential([mf.EncoderBlock(16, 2, 32, norm_first=norm_first, dropout=dropout),
                       mf.EncoderBlock(16, 2, 32, norm_first=norm_first, dropout=dropout),
                       mf.GlobalAvgPool(), mf.Dense(16, 3)])
    if lora:
        mf.add_lora(m, rank=2, alpha=4)
    for b in m.layers[:2]:
        b.checkpoint = ck
    return m


def _run(m):
    # two steps (the second on the buffers the first made): outputs, input grads, then the grads
    x = mf.Tensor.zeros((3, 5, 16))
    r = mf.tensor.Rng(11)
    for i in range(len(x.data)):
        x.data[i] = r.uniform(-1.0, 1.0)
    dy = mf.Tensor.zeros((3, 3))
    for i in range(len(dy.data)):
        dy.data[i] = (i % 7) * 0.1 - 0.3
    out = []
    for _ in range(2):
        out.append(list(m.forward(x).data))
        out.append(list(m.backward(dy).data))
    for _, g in m.collect_params([]):
        out.append(list(g.data))
    return out


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_checkpoint_bit_identical(lora):
    L.scratch.free()
    want = _run(_model(lora, False))
    L.scratch.free()
    got = _run(_model(lora, True))
    assert len(got) == len(want) and got == want


def _own_forward_bytes(layer):
    # float32 bytes of the forward stages the parts inside a block hold as their own arrays
    n = 0
    for s in layer.sublayers() if hasattr(layer, "sublayers") else ():
        n += _own_forward_bytes(s)
    for name in ("lora", "lora_q", "lora_k", "lora_v", "lora_o"):
        a = getattr(layer, name, None)
        if a is not None:
            n += _own_forward_bytes(a)
    for stage, st in (getattr(layer, "_stages", None) or {}).items():
        if stage == "_fwd":
            n += 4 * sum(len(a) for a in st[0])
    return n


def test_checkpoint_parts_keep_no_forward_buffers():
    kept = []
    for ck in (False, True):
        L.scratch.free()
        m = _model(True, ck)
        _run(m)
        kept.append(sum(_own_forward_bytes(p) for b in m.layers[:2] for p in b.sublayers()))
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
