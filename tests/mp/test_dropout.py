"""Dropout: the layer, the attention-weight dropout, the dropouts of FeedForward, EncoderBlock and
PositionalEncoding. eval() is the identity bit for bit; train() drops ~p with scale 1/(1-p); backward
reuses the forward's mask (gradcheck with the masks held fixed); one seed gives the same masks on
CPython and both MicroPython ports; against torch: eval outputs equal, train statistics agree."""
import os

import numpy as np
import pytest

import helpers
import microformer as mf
from microformer.spec import from_spec, to_spec
from microformer.tensor import Rng, Tensor



def _t(shape, seed, lo=-1.0, hi=1.0):
    r = np.random.default_rng(seed)
    a = r.uniform(lo, hi, size=shape).astype(np.float32)
    return Tensor.from_list(a.tolist()), a


def _np(t):
    return np.array(t.data, dtype=np.float64).reshape(t.shape)


# ---- the layer ------------------------------------------------------------------------------

def test_eval_is_the_identity(backend):
    x, _ = _t((3, 7, 5), 1)
    d = mf.Dropout(0.4).eval()
    assert d.forward(x) is x
    dy, _ = _t((3, 7, 5), 2)
    assert d.backward(dy) is dy
    assert mf.Dropout(0.0).forward(x) is x          # p = 0 drops nothing in training either


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_train_drops_p_with_torch_scale(backend, p):
    mf.seed(3)
    n = 40000
    x = Tensor.from_list([1.0] * n)
    y = _np(mf.Dropout(p).forward(x))
    dropped = float(np.mean(y == 0.0))
    sigma = (p * (1 - p) / n) ** 0.5
    assert abs(dropped - p) < 5 * sigma, (dropped, p)
    kept = np.unique(y[y != 0.0])
    assert kept.tolist() == [float(np.float32(1.0) / np.float32(1.0 - p))] or \
        kept.tolist() == [float(np.float32(1.0 / (1.0 - p)))], kept
    assert mf.Dropout(1.0).forward(x).data.tolist() == [0.0] * n


def test_backward_reuses_the_mask(backend):
    mf.seed(4)
    d = mf.Dropout(0.35)
    x, xa = _t((6, 40), 5)
    y = _np(d.forward(x))
    keep = np.frombuffer(d.mask(), dtype=np.uint8).reshape(6, 40)
    scale = 1.0 / 0.65
    np.testing.assert_allclose(y, np.where(keep == 1, xa * scale, 0.0), rtol=1e-6)
    dy, dya = _t((6, 40), 6)
    dx = _np(d.backward(dy))
    np.testing.assert_allclose(dx, np.where(keep == 1, dya * scale, 0.0), rtol=1e-6)
    # a second forward draws a new mask; backward follows it
    d.forward(x)
    keep2 = np.frombuffer(d.mask(), dtype=np.uint8).reshape(6, 40)
    assert (keep2 != keep).any()
    dx2 = _np(d.backward(dy))
    np.testing.assert_array_equal(dx2 == 0.0, keep2 == 0)


def test_keep_mask_is_next_u32():
    r1, r2 = Rng(99), Rng(99)
    buf = bytearray(500)
    r1.keep_mask(buf, 500, 1 << 23)
    assert list(buf) == [1 if (r2.next_u32() >> 8) >= (1 << 23) else 0 for _ in range(500)]
    assert r1.state == r2.state


def test_bad_arguments():
    for bad in (-0.1, 1.5, "0.1", None, True):
        with pytest.raises(ValueError, match=r"Dropout: dropout must be a number in \[0, 1\], got"):
            mf.Dropout(bad)
    with pytest.raises(ValueError, match="Dropout: seed must be an int or None, got 1.5"):
        mf.Dropout(0.1, seed=1.5)
    with pytest.raises(ValueError, match=r"Attention: dropout must be a number in \[0, 1\], got 2"):
        mf.Attention(8, 2, dropout=2)
    with pytest.raises(ValueError, match=r"EncoderBlock: dropout must be a number in \[0, 1\], got -1"):
        mf.EncoderBlock(8, 2, 16, dropout=-1)
    with pytest.raises(ValueError, match=r"FeedForward: dropout must be a number in \[0, 1\], got 'x'"):
        mf.FeedForward(8, 16, dropout="x")
    with pytest.raises(ValueError, match=r"PositionalEncoding: dropout must be a number in \[0, 1\], got 1.01"):
        mf.PositionalEncoding(8, 8, dropout=1.01)
    d = mf.Dropout(0.5)
    with pytest.raises(RuntimeError, match="Dropout: backward\\(\\) called before forward\\(\\)"):
        d.backward(Tensor.zeros((2, 2)))
    d.forward(Tensor.zeros((2, 2)))
    with pytest.raises(ValueError, match=r"Dropout: dy must be \(2, 2\), got \(2, 3\)"):
        d.backward(Tensor.zeros((2, 3)))
    with pytest.raises(ValueError, match="Dropout: x must be a Tensor, got list"):
        d.forward([1.0, 2.0])


# ---- inside the blocks -----------------------------------------------------------------------

def test_dropout_does_not_change_initial_weights():
    mf.seed(8)
    a = mf.Sequential([mf.PositionalEncoding(16, 8, dropout=0.1), mf.EncoderBlock(8, 2, 16, dropout=0.2),
                       mf.Dense(8, 3)])
    mf.seed(8)
    b = mf.Sequential([mf.PositionalEncoding(16, 8), mf.EncoderBlock(8, 2, 16), mf.Dense(8, 3)])
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    assert all(list(sa[k].data) == list(sb[k].data) for k in sa)


def test_block_eval_equals_no_dropout_bit_for_bit(backend):
    mf.seed(9)
    blk = mf.EncoderBlock(8, 2, 16, dropout=0.3)
    mf.seed(9)
    plain = mf.EncoderBlock(8, 2, 16)
    x, _ = _t((2, 6, 8), 10)
    dy, _ = _t((2, 6, 8), 11)
    blk.eval()
    y = list(blk.forward(x).data)
    dx = list(blk.backward(dy).data)
    assert y == list(plain.forward(x).data)
    assert dx == list(plain.backward(dy).data)
    assert [list(g.data) for _, g in blk.params()] == [list(g.data) for _, g in plain.params()]
    # and train() drops again: through every composite
    blk.train()
    assert blk.ffn.drop.training and blk.drop2.training and blk.attn.training
    assert list(blk.forward(x).data) != y


def _dropout_generators(layer, out):
    if isinstance(layer, mf.Dropout) and layer.rng is not None:
        out.append(layer.rng)
    if isinstance(layer, mf.Attention) and layer._drop_rng is not None:
        out.append(layer._drop_rng)
    for sub in layer.sublayers():
        _dropout_generators(sub, out)
    return out


def _fixed_mask_gradcheck(layer, shape, seed, tol):
    """d sum(y * dy) / dx by central differences with every dropout mask held fixed (each
    generator's state restored before every forward), against backward()."""
    gens = _dropout_generators(layer, [])
    assert gens, "the layer under test has no active dropout"
    states = [g.state for g in gens]

    def run(xa):
        for g, s in zip(gens, states):
            g.state = s
        return _np(layer.forward(Tensor.from_list(xa.tolist())))

    _, xa = _t(shape, seed)
    xa = xa.astype(np.float64)
    _, dya = _t(shape, seed + 1)
    run(xa)
    dx = _np(layer.backward(Tensor.from_list(dya.tolist())))
    num = np.zeros_like(xa)
    eps = 1e-2
    it = np.nditer(xa, flags=["multi_index"])
    for _ in it:
        i = it.multi_index
        old = xa[i]
        xa[i] = old + eps
        up = float((run(xa) * dya).sum())
        xa[i] = old - eps
        down = float((run(xa) * dya).sum())
        xa[i] = old
        num[i] = (up - down) / (2 * eps)
    err = float(np.abs(num - dx).max() / np.abs(num).max())
    assert err < tol, "gradcheck with fixed masks: relative error %.3g" % err
    return gens


@pytest.mark.parametrize("make", [
    lambda: mf.Dropout(0.4),
    lambda: mf.Attention(8, 2, dropout=0.3),
    lambda: mf.FeedForward(8, 12, dropout=0.3),
    lambda: mf.EncoderBlock(8, 2, 12, dropout=0.25),
], ids=["Dropout", "Attention", "FeedForward", "EncoderBlock"])
def test_gradcheck_with_fixed_mask(backend, make):
    mf.seed(12)
    layer = make()
    shape = (2, 5, 8)
    gens = _fixed_mask_gradcheck(layer, shape, 13, 3e-3)
    # fixing the masks is what the check relies on: a second forward draws a different one
    if isinstance(layer, mf.Dropout):
        x, _ = _t(shape, 13)
        layer.forward(x)
        m1 = layer.mask()
        layer.forward(x)
        assert layer.mask() != m1
    assert len(gens) >= 1


def test_positional_encoding_dropout(backend):
    mf.seed(14)
    pe = mf.PositionalEncoding(10, 8, dropout=0.5)
    x, xa = _t((2, 10, 8), 15)
    y = _np(pe.forward(x))
    keep = np.frombuffer(pe.drop.mask(), dtype=np.uint8).reshape(2, 10, 8)
    table = np.array(pe.pe.data, dtype=np.float64).reshape(10, 8)
    np.testing.assert_allclose(y, np.where(keep == 1, (xa + table) * 2.0, 0.0), rtol=1e-6, atol=1e-7)
    pe.eval()
    np.testing.assert_allclose(_np(pe.forward(x)), xa + table, rtol=1e-6, atol=1e-7)


def test_spec_carries_p():
    mf.seed(16)
    m = mf.Sequential([mf.PositionalEncoding(16, 8, dropout=0.1), mf.Dropout(0.2),
                       mf.EncoderBlock(8, 2, 16, dropout=0.3), mf.Attention(8, 2, dropout=0.4),
                       mf.FeedForward(8, 4, dropout=0.5)])
    s = to_spec(m)
    assert [l.get("dropout", l.get("p")) for l in s["layers"]] == [0.1, 0.2, 0.3, 0.4, 0.5]
    back = from_spec(s)
    assert [back[0].dropout, back[1].p, back[2].dropout, back[3].dropout, back[4].dropout] == \
        [0.1, 0.2, 0.3, 0.4, 0.5]
    assert back[2].attn.dropout == 0.3 and back[2].ffn.dropout == 0.3 and back[2].drop2.p == 0.3
    # without dropout the spec is what it was before dropout existed
    plain = to_spec(mf.Sequential([mf.EncoderBlock(8, 2, 16), mf.Attention(8, 2)]))
    assert "dropout" not in plain["layers"][0] and "dropout" not in plain["layers"][1]


# ---- the same masks everywhere ---------------------------------------------------------------

def test_same_seed_same_masks_on_every_interpreter(micropython):
    want = helpers.run_cpython(helpers.script("dropout_mp.py"), "python")
    assert "eval identity ok" in want and want.count("\n") == 7
    for backend in ("python", "viper"):
        got = helpers.run_micropython(helpers.script("dropout_mp.py"), backend, exe=micropython)
        assert got == want, "%s masks differ from CPython's:\n%s\nvs\n%s" % (backend, got, want)


# ---- against torch ---------------------------------------------------------------------------

torch = pytest.importorskip("torch") if not os.environ.get("CI") else __import__("torch")


def _torch_layer(seed):
    torch.manual_seed(seed)
    tm = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.2, activation="gelu", batch_first=True,
                                          norm_first=True)
    with torch.no_grad():
        for p in tm.parameters():
            p.uniform_(-0.5, 0.5)
    return tm


def test_torch_eval_mode_equal(backend):
    import torch_io
    tm = _torch_layer(1).eval()
    m = torch_io.from_torch(tm)
    assert m.dropout == pytest.approx(0.2) and m.attn.dropout == pytest.approx(0.2)
    m.eval()
    _, xa = _t((3, 6, 8), 17)
    want = tm(torch.tensor(xa)).detach().numpy()
    got = _np(m.forward(Tensor.from_list(xa.tolist())))
    assert helpers.rel_err(got, want) <= 1e-5
    back = torch_io.to_torch(m)
    assert back.dropout.p == pytest.approx(0.2) and back.self_attn.dropout == pytest.approx(0.2)


def test_torch_train_statistics(backend):
    """Masks differ between the two generators; what must agree: the fraction dropped, the scale of
    what is kept, and that a train-mode output is unbiased (its mean over many draws is the eval
    output), for the Dropout layer and for the attention-weight dropout."""
    p, n = 0.3, 50000
    ones = np.ones(n, dtype=np.float32)
    mf.seed(18)
    ours = _np(mf.Dropout(p).forward(Tensor.from_list(ones.tolist())))
    torch.manual_seed(18)
    theirs = torch.nn.Dropout(p)(torch.tensor(ones)).numpy()
    sigma = (p * (1 - p) / n) ** 0.5
    assert abs(np.mean(ours == 0) - np.mean(theirs == 0)) < 6 * sigma
    assert abs(np.mean(ours == 0) - p) < 5 * sigma
    np.testing.assert_allclose(np.unique(ours[ours != 0]), np.unique(theirs[theirs != 0]), rtol=1e-6)
    # attention-weight dropout: E[train output] = eval output, on both sides
    import torch_io
    tm = torch.nn.MultiheadAttention(8, 2, dropout=0.5, batch_first=True)
    m = torch_io.from_torch(tm)
    _, xa = _t((1, 6, 8), 19)
    xt = torch.tensor(xa)
    tm.eval()
    m.eval()
    ev_t = tm(xt, xt, xt, need_weights=False)[0].detach().numpy()
    ev_m = _np(m.forward(Tensor.from_list(xa.tolist())))
    assert helpers.rel_err(ev_m, ev_t) <= 1e-5
    tm.train()
    m.train()
    N = 400
    acc_t = sum(tm(xt, xt, xt, need_weights=False)[0].detach().numpy() for _ in range(N)) / N
    acc_m = sum(_np(m.forward(Tensor.from_list(xa.tolist()))) for _ in range(N)) / N
    one_t = tm(xt, xt, xt, need_weights=False)[0].detach().numpy()
    one_m = _np(m.forward(Tensor.from_list(xa.tolist())))
    spread_t = helpers.rel_err(one_t, ev_t)
    spread_m = helpers.rel_err(one_m, ev_m)
    assert spread_t > 0.05 and spread_m > 0.05           # one draw is far from eval...
    assert helpers.rel_err(acc_t, ev_t) < spread_t / 3    # ...the mean of 400 is close
    assert helpers.rel_err(acc_m, ev_m) < spread_m / 3


def test_generation_never_drops(backend):
    """prefill / decode_step are inference: in training mode they give the eval-mode numbers."""
    outs = []
    for mode in ("train", "eval"):
        mf.seed(20)
        model = mf.Sequential([mf.PositionalEncoding(16, 8, dropout=0.3),
                               mf.EncoderBlock(8, 2, 16, causal=True, max_len=16, dropout=0.3),
                               mf.Attention(8, 2, causal=True, max_len=16, dropout=0.3)])
        model.train() if mode == "train" else model.eval()
        x, _ = _t((1, 5, 8), 21)
        y = _np(mf.prefill(model, x))
        z = _np(mf.decode_step(model, _t((1, 1, 8), 22)[0]))
        outs.append((y, z))
    np.testing.assert_array_equal(outs[0][0], outs[1][0])
    np.testing.assert_array_equal(outs[0][1], outs[1][1])
