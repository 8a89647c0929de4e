"""state_dict with PyTorch's names and layouts: a torch module's state_dict() loaded into the
matching microformer layer gives the same forward output, input gradients and parameter
gradients (<= 1e-5 relative, CPython, portable and NumPy backends). Needs torch (host only)."""
import numpy as np
import pytest

import helpers  # noqa: F401  (paths)
import microformer as mf
from torch_compare import F, torch, to_mf as _mf, to_np as _np, close as _close  # noqa: E402



def _randomize(module, seed):
    # every parameter random (LayerNorm weights and attention biases are 1 / 0 by default)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.rand(p.shape, generator=g) * 1.0 - 0.5)
    return module


def _grads(layer):
    """{torch name: concatenated grad} for the layer's state entries."""
    by_id = {id(p): g for p, g in layer.params()}
    out = {}
    for name, parts in layer.state_parts():
        gs = [by_id[id(p)] for p in parts]
        out[name] = np.concatenate([_np(g).reshape(g.shape[0], -1) for g in gs]).reshape(
            (sum(g.shape[0] for g in gs),) + tuple(gs[0].shape[1:]))
    return out


def _compare(tm, layer, inputs, run_torch, run_mf, what):
    """Forward both, backprop the same random upstream gradient, compare everything."""
    missing, unexpected = layer.load_state_dict(tm.state_dict())
    assert missing == [] and unexpected == []
    tins = [t.clone().requires_grad_(t.is_floating_point()) for t in inputs]
    ty = run_torch(tm, *tins)
    g = torch.rand(ty.shape, generator=torch.Generator().manual_seed(9)) - 0.5
    (ty * g).sum().backward()
    y = run_mf(layer, *[_mf(t) for t in inputs])
    _close(y, ty, what + " forward")
    dx = layer.backward(_mf(g))
    second = getattr(layer, "dcontext", None) or getattr(layer, "dmemory", None)    # a second input's
    dins = tuple(d for d in (dx, second) if d is not None)
    floats = [t for t in tins if t.is_floating_point()]
    assert len(dins) == len(floats)
    for k, (d, t) in enumerate(zip(dins, floats)):
        _close(d, t.grad, "%s d(input %d)" % (what, k))
    grads = _grads(layer)
    names = [n for n, _ in tm.named_parameters()]
    assert sorted(names) == sorted(grads), (names, sorted(grads))
    for name, p in tm.named_parameters():
        _close(grads[name], p.grad, "%s grad %s" % (what, name))


def test_linear(backend):
    tm = _randomize(torch.nn.Linear(5, 3), 1)
    x = torch.rand(2, 4, 5) - 0.5
    _compare(tm, mf.Dense(5, 3), [x], lambda m, x: m(x), lambda l, x: l(x), "Linear")


def test_linear_no_bias(backend):
    tm = _randomize(torch.nn.Linear(4, 6, bias=False), 2)
    _compare(tm, mf.Dense(4, 6, use_bias=False), [torch.rand(3, 4)], lambda m, x: m(x),
             lambda l, x: l(x), "Linear no bias")


def _mha(E=8, H=2, seed=3, bias=True):
    return _randomize(torch.nn.MultiheadAttention(E, H, batch_first=True, bias=bias), seed)


def test_multihead_self_attention(backend):
    _compare(_mha(), mf.Attention(8, 2), [torch.rand(2, 5, 8) - 0.5],
             lambda m, x: m(x, x, x, need_weights=False)[0], lambda l, x: l(x), "MHA")


def test_multihead_attention_no_bias(backend):
    _compare(_mha(bias=False), mf.Attention(8, 2, use_bias=False), [torch.rand(2, 3, 8)],
             lambda m, x: m(x, x, x, need_weights=False)[0], lambda l, x: l(x), "MHA no bias")


def test_multihead_attention_key_padding_mask(backend):
    pad = [[0, 0, 0, 1, 1], [0, 1, 0, 0, 0]]
    tmask = torch.tensor(pad, dtype=torch.bool)
    _compare(_mha(seed=4), mf.Attention(8, 2), [torch.rand(2, 5, 8) - 0.5],
             lambda m, x: m(x, x, x, key_padding_mask=tmask, need_weights=False)[0],
             lambda l, x: l(x, key_padding_mask=pad), "MHA key_padding_mask")


def test_multihead_attention_causal(backend):
    S = 6
    causal = torch.nn.Transformer.generate_square_subsequent_mask(S)
    _compare(_mha(E=12, H=3, seed=5), mf.Attention(12, 3, causal=True), [torch.rand(2, S, 12) - 0.5],
             lambda m, x: m(x, x, x, attn_mask=causal, is_causal=True, need_weights=False)[0],
             lambda l, x: l(x), "MHA causal")


def test_multihead_cross_attention(backend):
    _compare(_mha(seed=6), mf.Attention(8, 2), [torch.rand(2, 3, 8) - 0.5, torch.rand(2, 5, 8) - 0.5],
             lambda m, x, c: m(x, c, c, need_weights=False)[0], lambda l, x, c: l(x, context=c),
             "MHA cross")


def test_layernorm(backend):
    _compare(_randomize(torch.nn.LayerNorm(6), 7), mf.LayerNorm(6), [torch.rand(3, 4, 6) * 4 - 2],
             lambda m, x: m(x), lambda l, x: l(x), "LayerNorm")


def test_embedding(backend):
    ids = torch.tensor([[3, 1, 4, 1], [5, 9, 2, 6]])
    _compare(_randomize(torch.nn.Embedding(11, 4), 8), mf.Embedding(11, 4), [ids],
             lambda m, i: m(i), lambda l, i: l(i), "Embedding")


@pytest.mark.parametrize("act,torch_act", [("gelu", "gelu"), ("relu", "relu"),
                                           ("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"))])
def test_transformer_encoder_layer(backend, act, torch_act):
    tm = _randomize(torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, activation=torch_act,
                                                     batch_first=True, norm_first=True), 10)
    _compare(tm, mf.EncoderBlock(8, 2, 16, activation=act), [torch.rand(2, 5, 8) - 0.5],
             lambda m, x: m(x), lambda l, x: l(x), "TransformerEncoderLayer " + act)


def test_transformer_encoder_layer_masks(backend):
    tm = _randomize(torch.nn.TransformerEncoderLayer(8, 2, 12, dropout=0.0, activation="gelu",
                                                     batch_first=True, norm_first=True), 11)
    pad = [[0, 0, 0, 0, 1], [0, 0, 0, 0, 0]]
    tpad = torch.tensor(pad, dtype=torch.bool)
    S = 5
    causal = torch.ones(S, S, dtype=torch.bool).triu(1)          # True = hidden, like tpad
    _compare(tm, mf.EncoderBlock(8, 2, 12, causal=True, activation="gelu"), [torch.rand(2, S, 8) - 0.5],
             lambda m, x: m(x, src_mask=causal, src_key_padding_mask=tpad, is_causal=True),
             lambda l, x: l(x, key_padding_mask=pad), "TransformerEncoderLayer causal + padding")


@pytest.mark.parametrize("act", ["gelu", "relu"])
def test_transformer_encoder_layer_post_norm(backend, act):
    # norm_first=False, torch's default: x1 = norm1(x + attn(x)), y = norm2(x1 + ffn(x1))
    tm = _randomize(torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, activation=act,
                                                     batch_first=True, norm_first=False), 13)
    _compare(tm, mf.EncoderBlock(8, 2, 16, activation=act, norm_first=False), [torch.rand(2, 5, 8) * 2 - 1],
             lambda m, x: m(x), lambda l, x: l(x), "post-norm TransformerEncoderLayer " + act)


def test_transformer_encoder_layer_post_norm_masks(backend):
    tm = _randomize(torch.nn.TransformerEncoderLayer(8, 2, 12, dropout=0.0, activation="gelu",
                                                     batch_first=True, norm_first=False), 14)
    pad = [[0, 0, 0, 1, 1], [0, 0, 0, 0, 0]]
    S = 5
    causal = torch.ones(S, S, dtype=torch.bool).triu(1)
    _compare(tm, mf.EncoderBlock(8, 2, 12, causal=True, activation="gelu", norm_first=False),
             [torch.rand(2, S, 8) - 0.5],
             lambda m, x: m(x, src_mask=causal, src_key_padding_mask=torch.tensor(pad, dtype=torch.bool),
                            is_causal=True),
             lambda l, x: l(x, key_padding_mask=pad), "post-norm TransformerEncoderLayer causal + padding")


def test_streaming_refuses_a_post_norm_block():
    # StreamingEncoder runs a block's pre-norm steps itself: a post-norm one would compute otherwise
    with pytest.raises(ValueError, match=r"layer 1 is a post-norm EncoderBlock \(norm_first=False\)"):
        mf.StreamingEncoder(mf.Sequential([mf.Dense(4, 8), mf.EncoderBlock(8, 2, 16, norm_first=False)]), 4, 2)
    mf.StreamingEncoder(mf.Sequential([mf.Dense(4, 8), mf.EncoderBlock(8, 2, 16)]), 4, 2)


def test_sequential_names_keep_parameter_free_indices(backend):
    tm = _randomize(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)), 12)
    m = mf.Sequential([mf.Dense(4, 8), mf.ActivationLayer("relu"), mf.Dense(8, 3)])
    assert list(m.state_dict()) == list(tm.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    _compare(tm, m, [torch.rand(5, 4) - 0.5], lambda m, x: m(x), lambda l, x: l(x), "Sequential")


def test_state_dict_round_trip_through_torch():
    m = mf.Sequential([mf.Dense(4, 8), mf.Reshape((2, 4)), mf.Attention(4, 2), mf.GlobalAvgPool()])
    sd = m.state_dict()
    assert list(sd) == ["0.weight", "0.bias", "2.in_proj_weight", "2.in_proj_bias",
                        "2.out_proj.weight", "2.out_proj.bias"]
    assert sd["2.in_proj_weight"].shape == (12, 4)
    want = {k: list(v.data) for k, v in sd.items()}
    tsd = {k: torch.tensor(v.tolist()) for k, v in sd.items()}
    m2 = mf.Sequential([mf.Dense(4, 8), mf.Reshape((2, 4)), mf.Attention(4, 2), mf.GlobalAvgPool()])
    m2.load_state_dict(tsd)
    assert {k: list(v.data) for k, v in m2.state_dict().items()} == want
    # in_proj_weight rows are [Wq; Wk; Wv]
    assert list(m2[2].Wk.data) == want["2.in_proj_weight"][16:32]


def _snapshot(m):
    return [bytes(p.data) for p, _ in m.params()]


@pytest.mark.parametrize("bad,words", [
    (lambda sd: sd.pop("0.bias"), ["missing keys ['0.bias']"]),
    (lambda sd: sd.update({"3.weight": [[1.0]]}), ["unexpected keys ['3.weight']"]),
    (lambda sd: sd.update({"2.weight": torch.zeros(3, 7)}), ["'2.weight'", "[3, 7]", "[3, 8]"]),
    (lambda sd: sd.update({"2.bias": [1.0, float("nan"), 0.0]}), ["'2.bias'", "non-finite"]),
    (lambda sd: sd.update({"2.bias": [[1.0, 2.0], [3.0]]}), ["'2.bias'", "rectangular"]),
    (lambda sd: sd.update({"2.bias": "abc"}), ["'2.bias'", "str"]),
])
def test_load_state_dict_refuses_before_touching_a_weight(bad, words):
    m = mf.Sequential([mf.Dense(4, 8), mf.ActivationLayer("relu"), mf.Dense(8, 3)])
    other = mf.Sequential([mf.Dense(4, 8), mf.ActivationLayer("relu"), mf.Dense(8, 3)])
    sd = {k: v.tolist() for k, v in other.state_dict().items()}   # every value differs from m's
    bad(sd)
    before = _snapshot(m)
    with pytest.raises(ValueError) as e:
        m.load_state_dict(sd)
    for w in words:
        assert w in str(e.value)
    assert _snapshot(m) == before


def test_load_state_dict_not_strict_reports_keys():
    m = mf.Sequential([mf.Dense(2, 2)])
    missing, unexpected = m.load_state_dict({"0.weight": [[1.0, 2.0], [3.0, 4.0]], "9.x": [1.0]},
                                            strict=False)
    assert (missing, unexpected) == (["0.bias"], ["9.x"])
    assert list(m[0].W.data) == [1.0, 2.0, 3.0, 4.0]


def test_pytorch_habits():
    m = mf.Sequential([mf.Dense(3, 2)])
    x = mf.Tensor.from_list([[1.0, 2.0, 3.0]])
    assert list(m(x).data) == list(m.forward(x).data)
    opt = mf.Adam(m.parameters(), lr=0.1)
    assert [id(p) for p, _ in opt.params] == [id(p) for p, _ in m.params()]
    for name in ("train", "data", "checkpoint"):
        assert hasattr(mf, name), name


def test_post_norm_block_inside_micropython(tmp_path, micropython):
    # the post-norm EncoderBlock's forward and backward inside MicroPython (portable loops and viper):
    # outputs and input grads against torch, parameter grads against CPython's (checked against torch above)
    import copy
    import driver_mp
    tm = _randomize(torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True, norm_first=False), 15)
    layer = mf.EncoderBlock(8, 2, 16, activation="relu", norm_first=False)
    layer.load_state_dict(tm.state_dict())
    x = torch.rand(2, 5, 8) * 2 - 1
    dy = torch.rand(2, 5, 8, generator=torch.Generator().manual_seed(16)) - 0.5
    tx = x.clone().requires_grad_(True)
    ty = tm(tx)
    (ty * dy).sum().backward()
    case = {"layer": {"type": "EncoderBlock", "args": [8, 2, 16],
                      "kwargs": {"activation": "relu", "norm_first": False}},
            "params": {p.name: list(p.data) for p, _ in layer.params()},
            "x": {"shape": [2, 5, 8], "data": x.reshape(-1).tolist()},
            "dy": {"shape": [2, 5, 8], "data": dy.reshape(-1).tolist()}}
    mf.set_backend("python")
    try:
        want = driver_mp.run_case(copy.deepcopy(case))
    finally:
        mf.set_backend("numpy")
    for backend, tol in (("python", 1e-5), ("viper", 5e-3)):
        got = helpers.run_cases_micropython([dict(case, backend=backend)], tmp_path, backend, exe=micropython)[0]
        _close(np.asarray(got["y"]).reshape(2, 5, 8), ty, backend + " y", tol)
        _close(np.asarray(got["dx"]).reshape(2, 5, 8), tx.grad, backend + " dx", tol)
        grads = [k for k in want if k.startswith("d") and k not in ("dx", "dQ")]
        assert len(grads) == 16, grads
        scale = max(float(np.abs(np.asarray(got[k])).max()) for k in grads)
        for k in grads:
            if k == "dattn.bk":     # 0 in exact arithmetic (softmax ignores a shift shared by a row's scores)
                assert float(np.abs(np.asarray(got[k])).max()) <= tol * scale, (backend, got[k])
                continue
            _close(np.asarray(got[k]), np.asarray(want[k]), "%s %s" % (backend, k), tol)
