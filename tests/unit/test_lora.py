"""LoRA adapters (mf.lora) and freezing by name, on the portable and NumPy backends.

References are built from torch ops, y = x W^T + b + (alpha/r) (x A^T) B^T, with torch autograd for
the gradients (float64), compared within 1e-5. tests/mp/test_lora_micropython.py runs tests/mp/lora_mp.py inside
MicroPython (both ports, python and viper backends).
"""
import numpy as np
import pytest
import torch

import microformer as mf
from microformer import lora as L
from microformer.loss import CrossEntropyLoss

import sensor

TOL = 1e-5


def _rand(t, seed, scale=1.0):
    rng = np.random.default_rng(seed)
    t.data[:] = mf.Tensor(t.shape).data.__class__("f", (rng.uniform(-1, 1, t.size) * scale).tolist())
    return t


def _np(t):
    return np.array(t.data, dtype=np.float64).reshape(t.shape)


def _th(t, grad=False):
    return torch.tensor(_np(t), dtype=torch.float64, requires_grad=grad)


def _close(a, b, what):
    a = np.asarray(a, dtype=np.float64)
    b = b.detach().numpy() if isinstance(b, torch.Tensor) else np.asarray(b)
    assert a.shape == b.shape, (what, a.shape, b.shape)
    err = float(np.max(np.abs(a - b))) if a.size else 0.0
    assert err <= TOL, "%s: max error %g" % (what, err)


def _lin(x, W, b, a):
    # torch ops: x W^T + b + (alpha/r) (x A^T) B^T
    y = x @ W.T + (0 if b is None else b)
    if a is not None:
        A, B, s = a
        y = y + s * ((x @ A.T) @ B.T)
    return y


def _adapter(a):
    return (_th(a.A, True), _th(a.B, True), a.scaling)


def test_dense_lora_forward_backward_vs_torch(backend):
    mf.seed(3)
    d = mf.Dense(6, 5)
    _rand(d.b, 1)
    (name, a), = L.add_lora(d, rank=2, alpha=3, targets="dense")
    assert name == "" and a is d.lora
    _rand(a.B, 2)                       # a trained adapter (B starts at zero)
    x = _rand(mf.Tensor((2, 3, 6)), 4)
    dy = _rand(mf.Tensor((2, 3, 5)), 5)
    y = d.forward(x)
    dx = d.backward(dy)
    tx = _th(x, True)
    W, b = _th(d.W), _th(d.b)
    A, B, s = _adapter(a)
    ty = _lin(tx, W, b, (A, B, s))
    ty.backward(_th(dy))
    _close(_np(y), ty, "y")
    _close(_np(dx), tx.grad, "dx")
    _close(_np(a.dA), A.grad, "dA")
    _close(_np(a.dB), B.grad, "dB")
    assert d.dW.data is None and d.db.data is None        # the base is frozen: no grad buffers
    assert s == 1.5


def _mha(x, c, P, E, H, causal=False):
    # multi-head attention from torch ops; P[n] = (W, b, adapter or None) for n in q k v o
    D = E // H
    B, S, _ = x.shape
    Sk = c.shape[1]
    q = _lin(x, *P["q"]).reshape(B, S, H, D).transpose(1, 2)
    k = _lin(c, *P["k"]).reshape(B, Sk, H, D).transpose(1, 2)
    v = _lin(c, *P["v"]).reshape(B, Sk, H, D).transpose(1, 2)
    sc = q @ k.transpose(-1, -2) / D ** 0.5
    if causal:
        sc = sc.masked_fill(torch.ones(S, Sk, dtype=torch.bool).triu(1), float("-inf"))
    ctx = (torch.softmax(sc, -1) @ v).transpose(1, 2).reshape(B, S, E)
    return _lin(ctx, *P["o"])


def _attn_params(att, grad_adapters=True):
    P = {}
    for n in "qkvo":
        a = getattr(att, "lora_" + n)
        P[n] = (_th(getattr(att, "W" + n)), _th(getattr(att, "b" + n)),
                None if a is None else _adapter(a))
    return P


@pytest.mark.parametrize("cross", [False, True])
def test_attention_lora_forward_backward_vs_torch(backend, cross):
    mf.seed(4)
    E, H = 8, 2
    att = mf.Attention(E, H)
    for n in "qkvo":
        _rand(getattr(att, "b" + n), ord(n))
    found = L.add_lora(att, rank=3, alpha=6, targets="attention")
    assert [n for n, _ in found] == ["q_proj", "k_proj", "v_proj", "out_proj"]
    for i, (_, a) in enumerate(found):
        _rand(a.B, 10 + i, 0.5)
    x = _rand(mf.Tensor((2, 3, E)), 20)
    c = _rand(mf.Tensor((2, 4, E)), 21) if cross else None
    dy = _rand(mf.Tensor((2, 3, E)), 22)
    y = att.forward(x, context=c)
    dx = att.backward(dy)
    tx = _th(x, True)
    tc = _th(c, True) if cross else tx
    P = _attn_params(att)
    ty = _mha(tx, tc, P, E, H)
    ty.backward(_th(dy))
    _close(_np(y), ty, "y")
    if cross:
        _close(_np(att.dcontext), tc.grad, "dcontext")
    _close(_np(dx), tx.grad, "dx")
    for n, (_, a) in zip("qkvo", found):
        _close(_np(a.dA), P[n][2][0].grad, "d%s lora_A" % n)
        _close(_np(a.dB), P[n][2][1].grad, "d%s lora_B" % n)
        assert getattr(att, "dW" + n).data is None and getattr(att, "db" + n).data is None


def _block_model():
    mf.seed(6)
    return mf.Sequential([mf.Dense(4, 16), mf.Reshape((2, 8)), mf.EncoderBlock(8, 2, 12),
                          mf.GlobalAvgPool(), mf.Dense(8, 3)])


def _train_adapters(found, seed=30):
    for i, (_, a) in enumerate(found):
        _rand(a.B, seed + i, 0.3)


def test_block_adapters_merge_into_torch_with_one_add(backend):
    # the state_dict names map onto nn.TransformerEncoderLayer: base weights load as they are,
    # each adapter is one add: in_proj_weight[rows of q/k/v] += s B A, linear1.weight += s B A
    model = _block_model()
    found = L.add_lora(model, rank=2, alpha=4, targets=("attention", "ffn"))
    _train_adapters(found)
    x = _rand(mf.Tensor((3, 4)), 40)
    y = _np(model.forward(x))
    E = 8
    blk = torch.nn.TransformerEncoderLayer(E, 2, 12, dropout=0.0, activation="gelu", batch_first=True,
                                           norm_first=True).double()
    sd = {k: torch.tensor(_np(v), dtype=torch.float64) for k, v in model.state_dict().items()}
    base = {k[2:]: v for k, v in sd.items() if k.startswith("2.") and "lora_" not in k}
    blk.load_state_dict(base)
    rows = {"q_proj": 0, "k_proj": E, "v_proj": 2 * E}
    with torch.no_grad():
        for name, a in found:
            delta = a.scaling * sd[name + ".lora_B.weight"] @ sd[name + ".lora_A.weight"]
            part = name.split(".")[-1]
            if part in rows:
                blk.self_attn.in_proj_weight[rows[part]:rows[part] + E] += delta
            elif part == "out_proj":
                blk.self_attn.out_proj.weight += delta
            else:                                       # linear1, linear2
                getattr(blk, part).weight += delta
        tx = torch.tensor(_np(x), dtype=torch.float64)
        h = (tx @ sd["0.weight"].T + sd["0.bias"]).reshape(3, 2, 8)
        ty = blk(h).mean(1) @ sd["4.weight"].T + sd["4.bias"]
    _close(y, ty, "merged torch block vs unmerged adapters")


def test_merge_gives_the_same_outputs(backend):
    model = _block_model()
    found = L.add_lora(model, rank=2, alpha=4, targets=("attention", "ffn", "dense"))
    assert len(found) == 8
    _train_adapters(found)
    x = _rand(mf.Tensor((3, 4)), 41)
    y = _np(model.forward(x)).copy()
    n_params = len(model.params())
    assert L.merge_lora(model) == 8
    assert L.adapters(model) == [] and len(model.params()) == n_params - 16
    assert not any("lora_" in k for k in model.state_dict())
    _close(_np(model.forward(x)), y, "merged vs unmerged")


def test_fresh_adapters_change_nothing_and_follow_the_seed():
    model = _block_model()
    x = _rand(mf.Tensor((3, 4)), 42)
    y0 = bytes(model.forward(x).data)
    mf.seed(11)
    found = L.add_lora(model, rank=4, alpha=8)
    assert bytes(model.forward(x).data) == y0          # B = 0
    for _, a in found:
        assert not any(a.B.data)
        bound = 1.0 / a.in_features ** 0.5            # peft: kaiming_uniform(a=sqrt(5)) on A
        assert max(abs(v) for v in a.A.data) <= bound and max(abs(v) for v in a.A.data) > 0.5 * bound
    model2 = _block_model()
    mf.seed(11)
    found2 = L.add_lora(model2, rank=4, alpha=8)
    assert [bytes(a.A.data) for _, a in found] == [bytes(a.A.data) for _, a in found2]


def test_state_dict_names_and_shapes():
    model = _block_model()
    L.add_lora(model, rank=3, alpha=6, targets=("attention", "ffn", "4"))
    sd = model.state_dict()
    lora_keys = [k for k in sd if "lora_" in k]
    want = []
    for part, (o, i) in (("self_attn.q_proj", (8, 8)), ("self_attn.k_proj", (8, 8)),
                         ("self_attn.v_proj", (8, 8)), ("self_attn.out_proj", (8, 8)),
                         ("linear1", (12, 8)), ("linear2", (8, 12))):
        want += [("2.%s.lora_A.weight" % part, (3, i)), ("2.%s.lora_B.weight" % part, (o, 3))]
    want += [("4.lora_A.weight", (3, 8)), ("4.lora_B.weight", (3, 3))]
    assert sorted(lora_keys) == sorted(k for k, _ in want)
    for k, shape in want:
        assert tuple(sd[k].shape) == shape, k
    # load_state_dict round trip: values land in the adapters
    other = _block_model()
    L.add_lora(other, rank=3, alpha=6, targets=("attention", "ffn", "4"))
    _train_adapters(L.adapters(model))
    other.load_state_dict(model.state_dict())
    for (_, a), (_, b) in zip(L.adapters(model), L.adapters(other)):
        assert bytes(a.B.data) == bytes(b.B.data) and bytes(a.A.data) == bytes(b.A.data)


def _count(model):
    return sum(p.size for p, _ in model.parameters())


def test_trainable_parameter_counts():
    r = 4
    model = _block_model()
    total = model.param_count()
    L.add_lora(model, rank=r, alpha=8, targets=("attention", "ffn"))
    E, Hd = 8, 12
    assert _count(model) == L.trainable_count(model) == 4 * r * (E + E) + r * (E + Hd) + r * (Hd + E)
    assert model.param_count() == total + _count(model)
    model.layers[-1].trainable = True          # the head trains too (peft's modules_to_save)
    assert _count(model) == 4 * r * 16 + 2 * r * 20 + 8 * 3 + 3
    # bias + LayerNorm only
    m2 = _block_model()
    names = mf.freeze_except(m2, "bias", "norm")
    assert names == ["0.bias", "2.self_attn.in_proj_bias", "2.self_attn.out_proj.bias", "2.linear1.bias",
                     "2.linear2.bias", "2.norm1.weight", "2.norm1.bias", "2.norm2.weight", "2.norm2.bias",
                     "4.bias"]
    assert _count(m2) == 16 + 3 * 8 + 8 + 12 + 8 + 4 * 8 + 3
    assert m2.layers[0].dW.data is None and m2.layers[0].db.data is not None


def test_bias_norm_only_gradients_vs_full(backend):
    # bias + LayerNorm fine-tuning: the biases' and norms' grads are the full backward's, bit for bit
    x = _rand(mf.Tensor((3, 4)), 43)
    ref = _block_model()
    lf = CrossEntropyLoss()
    lf.forward(ref.forward(x), [0, 1, 2])
    ref.backward(lf.backward())
    m = _block_model()
    L.freeze_except(m, "bias", "norm")
    lf.forward(m.forward(x), [0, 1, 2])
    m.backward(lf.backward())
    live = 0
    for (p, g), (_, rg) in zip(m.params(), ref.params()):
        if g.data is not None:
            live += 1
            assert bytes(g.data) == bytes(rg.data), p.name
    assert live == len(m.parameters()) == 1 + 4 + 2 + 2 + 2 + 1   # b; bq bk bv bo; ln1; ln2; b1 b2; head b


def test_lora_finetune_reduces_loss_and_keeps_the_base(backend):
    model = sensor.build_model(seed=2, filters=8)
    L.add_lora(model, rank=4, alpha=8, targets=("attention", "ffn"))
    model.layers[-1].trainable = True
    base = [(p.name, bytes(p.data)) for p, g in model.params() if g.data is None]
    assert base
    rng = np.random.default_rng(7)
    x = mf.Tensor((8, 600))
    x.data[:] = x.data.__class__("f", rng.normal(0, 1, 4800).tolist())
    y = [0, 1, 2, 3, 0, 1, 2, 3]
    opt = mf.Adam(model, lr=1e-2)
    lf = CrossEntropyLoss()
    losses = []
    for _ in range(8):
        opt.zero_grad()
        losses.append(lf.forward(model.forward(x), y))
        model.backward(lf.backward())
        opt.step()
    assert losses[-1] < 0.8 * losses[0], losses
    assert [(p.name, bytes(p.data)) for p, g in model.params() if g.data is None] == base
    assert any(any(a.B.data) for _, a in L.adapters(model))


def test_exported_names():
    assert mf.add_lora is L.add_lora and mf.merge_lora is L.merge_lora and mf.freeze_except is L.freeze_except


def test_targets_by_name_and_glob():
    model = _block_model()
    assert [n for n, _ in L.add_lora(model, targets=["*.q_proj", "2.linear2"])] == \
        ["2.self_attn.q_proj", "2.linear2"]
    blk = model.layers[2]
    assert blk.attn.lora_q is not None and blk.attn.lora_k is None and blk.ffn.fc2.lora is not None
    with pytest.raises(ValueError, match="2.self_attn.q_proj already has an adapter"):
        L.add_lora(model, targets=["2.self_attn.q_proj"])
    m2 = _block_model()
    with pytest.raises(ValueError, match=r"target '\*\.q' matches no linear map; the model has \['0', "):
        L.add_lora(m2, targets=["*.q"])
    with pytest.raises(ValueError, match="rank must be a positive int, got 0"):
        L.add_lora(m2, rank=0)
    with pytest.raises(ValueError, match="alpha must be a positive number, got -1"):
        L.add_lora(m2, alpha=-1)
    with pytest.raises(ValueError, match="'nope' matches no parameter"):
        L.freeze_except(m2, "nope")


def test_decoding_with_unmerged_adapters_is_refused():
    mf.seed(8)
    att = mf.Attention(8, 2, causal=True, max_len=6)
    L.add_lora(att, targets="attention")
    x = _rand(mf.Tensor((1, 3, 8)), 44)
    att.prefill(x)
    with pytest.raises(ValueError, match=r"merge the LoRA adapters first \(mf.merge_lora\(model\)\)"):
        att.decode_step(_rand(mf.Tensor((1, 1, 8)), 45))
    L.merge_lora(att)
    att.prefill(x)
    att.decode_step(_rand(mf.Tensor((1, 1, 8)), 45))


def test_decoder_block_cross_attention_gets_adapters():
    mf.seed(9)
    tr = mf.Transformer(11, 13, 8, 2, 12, num_encoder_layers=1, num_decoder_layers=1)
    names = [n for n, _ in L.add_lora(tr, targets="attention")]
    assert "decoder.layers.0.multihead_attn.q_proj" in names
    assert "encoder.layers.0.self_attn.out_proj" in names and len(names) == 12
    sd = tr.state_dict()
    assert tuple(sd["decoder.layers.0.multihead_attn.v_proj.lora_B.weight"].shape) == (8, 4)


def test_checkpoint_of_an_adapted_model(tmp_path):
    # every adapter tensor has its own name in a checkpoint; loading into a model with the same
    # adapters restores them bit for bit.
    model = _block_model()
    L.add_lora(model, rank=2, alpha=4, targets=("attention", "ffn", "dense"))
    _train_adapters(L.adapters(model))
    names = [n for n, _ in model.named_params()]
    assert len(set(names)) == len(names)
    assert "2.self_attn.q_proj.lora_A" in names and "4.lora_B" in names and "2.linear1.lora_A" in names
    path = str(tmp_path / "lora.mfck")
    mf.save_checkpoint(path, model, meta={"classes": ["a", "b", "c"]})
    other = _block_model()
    L.add_lora(other, rank=2, alpha=4, targets=("attention", "ffn", "dense"))
    mf.load_checkpoint(path, other)
    for (_, a), (_, b) in zip(L.adapters(model), L.adapters(other)):
        assert bytes(a.A.data) == bytes(b.A.data) and bytes(a.B.data) == bytes(b.B.data)
    # load_model rebuilds the adapters from the spec's 'lora' entry (tests/unit/test_adapter.py)
    again = mf.load_model(path)
    assert [bytes(p.data) for _, p in again.named_params()] == [bytes(p.data) for _, p in model.named_params()]
