"""DecoderBlock(dropout=p) and Transformer(dropout=p), as nn.TransformerDecoderLayer(dropout=p):
eval() is the dropout=0 block bit for bit; train() drops after the self-attention, after the
cross-attention, inside the FFN and after the FFN, and on both attentions' weights; backward reuses
every mask (gradcheck with the masks held fixed); generation never drops; the spec carries p only
when non-zero; torch_io converts the torch layer's dropout (eval outputs equal) and refuses
differing dropouts by name; one seed gives the same masks on CPython and both MicroPython ports."""
import os

import numpy as np
import pytest

import helpers
import microformer as mf
from microformer.spec import from_spec, to_spec
from microformer.tensor import Tensor

from test_dropout import _dropout_generators, _np, _t


def _pair(p, seed=9):
    mf.seed(seed)
    blk = mf.DecoderBlock(8, 2, 16, max_len=8, dropout=p)
    mf.seed(seed)
    plain = mf.DecoderBlock(8, 2, 16, max_len=8)
    return blk, plain


def test_dropout_does_not_change_initial_weights():
    blk, plain = _pair(0.3)
    sa, sb = blk.state_dict(), plain.state_dict()
    assert list(sa) == list(sb) and all(list(sa[k].data) == list(sb[k].data) for k in sa)
    mf.seed(3)
    a = mf.Transformer(7, 9, 8, 2, 16, 2, 2, max_len=10, dropout=0.2)
    mf.seed(3)
    b = mf.Transformer(7, 9, 8, 2, 16, 2, 2, max_len=10)
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb) and all(list(sa[k].data) == list(sb[k].data) for k in sa)


def test_every_dropout_is_there():
    blk = mf.DecoderBlock(8, 2, 16, dropout=0.3)
    assert [blk.self_attn.dropout, blk.cross_attn.dropout, blk.drop1.p, blk.drop2.p, blk.drop3.p,
            blk.ffn.dropout, blk.dropout] == [0.3] * 7
    t = mf.Transformer(7, 9, 8, 2, 16, 1, 2, dropout=0.1)
    assert t.src_pos.dropout == 0.1 and t.tgt_pos.dropout == 0.1
    assert all(e.dropout == 0.1 for e in t.encoder) and all(d.dropout == 0.1 for d in t.decoder)
    assert len(_dropout_generators(t, [])) == 2 + 4 * 1 + 6 * 2   # 2 pos, 4 per encoder, 6 per decoder


def test_block_eval_equals_no_dropout_bit_for_bit(backend):
    blk, plain = _pair(0.3)
    x, _ = _t((2, 6, 8), 10)
    m, _ = _t((2, 4, 8), 11)
    dy, _ = _t((2, 6, 8), 12)
    blk.eval()
    kw = {"tgt_lengths": [6, 4], "memory_lengths": [3, 4]}
    y = list(blk.forward(x, m, **kw).data)
    dx = blk.backward(dy)
    dm = blk.dmemory
    assert y == list(plain.forward(x, m, **kw).data)
    pdx = plain.backward(dy)
    pdm = plain.dmemory
    assert list(dx.data) == list(pdx.data) and list(dm.data) == list(pdm.data)
    assert [list(g.data) for _, g in blk.params()] == [list(g.data) for _, g in plain.params()]
    blk.train()                      # train() reaches every dropout again
    assert all(d.training for d in (blk.drop1, blk.drop2, blk.drop3, blk.ffn.drop, blk.self_attn,
                                     blk.cross_attn))
    assert list(blk.forward(x, m, **kw).data) != y


def test_transformer_eval_equals_no_dropout_bit_for_bit(backend):
    src = [[1, 2, 3, 4], [5, 6, 0, 0]]
    tgt = [[1, 2, 3], [4, 5, 0]]
    out = []
    for p in (0.25, 0.0):
        mf.seed(5)
        t = mf.Transformer(7, 9, 8, 2, 16, 1, 2, max_len=10, dropout=p).eval()
        y = t.forward(src, tgt, [4, 2], [3, 2])
        dy, _ = _t(y.shape, 6)
        t.backward(dy)
        out.append((list(y.data), [list(g.data) for _, g in t.params()]))
    assert out[0] == out[1]
    mf.seed(5)
    t = mf.Transformer(7, 9, 8, 2, 16, 1, 2, max_len=10, dropout=0.25)
    assert t.src_pos.training and t.tgt_pos.drop.training
    assert list(t.forward(src, tgt, [4, 2], [3, 2]).data) != out[0][0]


@pytest.mark.parametrize("p", [0.2, 0.6])
def test_train_drops_p_in_each_place(backend, p):
    """Each of the block's masks drops about p; the kept values are scaled by 1/(1-p)."""
    mf.seed(13)
    blk = mf.DecoderBlock(16, 2, 32, dropout=p)
    x, _ = _t((4, 24, 16), 14)
    m, _ = _t((4, 20, 16), 15)
    blk.forward(x, m)
    masks = {"drop1": blk.drop1.mask(), "drop2": blk.drop2.mask(), "drop3": blk.drop3.mask(),
             "ffn": blk.ffn.drop.mask(), "self_attn": bytes(blk.self_attn._keep[:4 * 2 * 24 * 24]),
             "cross_attn": bytes(blk.cross_attn._keep[:4 * 2 * 24 * 20])}
    for name, mask in masks.items():
        n = len(mask)
        dropped = 1.0 - sum(mask) / n
        assert abs(dropped - p) < 5 * (p * (1 - p) / n) ** 0.5, (name, dropped, p)
    assert len(set(masks.values())) == len(masks)            # six different masks
    # drop1 is applied to the self-attention's output: y1 = a * keep / (1-p)
    a = _np(blk.self_attn._y)
    d1 = _np(blk.drop1._y)
    keep = np.frombuffer(masks["drop1"], dtype=np.uint8).reshape(a.shape)
    np.testing.assert_allclose(d1, np.where(keep == 1, a / (1 - p), 0.0), rtol=1e-6, atol=1e-7)


def test_gradcheck_with_fixed_masks(backend):
    """d sum(y * dy) / d(x, memory) by central differences, every mask held fixed, against backward."""
    mf.seed(12)
    blk = mf.DecoderBlock(8, 2, 12, dropout=0.25)
    gens = _dropout_generators(blk, [])
    assert len(gens) == 6
    states = [g.state for g in gens]
    _, xa = _t((2, 4, 8), 13)
    _, ma = _t((2, 3, 8), 14)
    _, dya = _t((2, 4, 8), 15)
    xa, ma = xa.astype(np.float64), ma.astype(np.float64)

    def run(xa, ma):
        for g, s in zip(gens, states):
            g.state = s
        return _np(blk.forward(Tensor.from_list(xa.tolist()), Tensor.from_list(ma.tolist()),
                               tgt_lengths=[4, 3], memory_lengths=[3, 2]))

    run(xa, ma)
    dx = blk.backward(Tensor.from_list(dya.tolist()))
    dm = blk.dmemory
    for arr, got, what in ((xa, _np(dx), "x"), (ma, _np(dm), "memory")):
        num = np.zeros_like(arr)
        eps = 1e-2
        for i in np.ndindex(arr.shape):
            old = arr[i]
            arr[i] = old + eps
            up = float((run(xa, ma) * dya).sum())
            arr[i] = old - eps
            down = float((run(xa, ma) * dya).sum())
            arr[i] = old
            num[i] = (up - down) / (2 * eps)
        err = float(np.abs(num - got).max() / np.abs(num).max())
        assert err < 3e-3, "gradcheck d(%s) with fixed masks: relative error %.3g" % (what, err)
    # the check relies on the fixed masks: an unfixed second forward draws other masks
    y1 = run(xa, ma)
    y2 = _np(blk.forward(Tensor.from_list(xa.tolist()), Tensor.from_list(ma.tolist())))
    assert not np.array_equal(y1, y2)


def test_generation_never_drops(backend):
    """cache_memory / prefill / decode_step and Transformer.generate in train() give eval()'s numbers."""
    outs = []
    for mode in ("train", "eval"):
        blk, _ = _pair(0.4, 20)
        blk.train(mode == "train")
        m, _ = _t((2, 3, 8), 21)
        x, _ = _t((2, 4, 8), 22)
        blk.cache_memory(m, memory_lengths=[3, 2])
        y = _np(blk.prefill(x, tgt_lengths=[4, 2]))
        z = _np(blk.decode_step(_t((2, 1, 8), 23)[0]))
        mf.seed(24)
        t = mf.Transformer(7, 9, 8, 2, 16, 1, 2, max_len=10, dropout=0.4).train(mode == "train")
        g = t.generate([[1, 2, 3], [4, 5, 0]], [3, 2], bos=1, max_new=6)
        outs.append((y, z, g, [l.training for l in (t, t.src_pos, t.encoder[0].drop2, t.decoder[1].ffn.drop)]))
    np.testing.assert_array_equal(outs[0][0], outs[1][0])
    np.testing.assert_array_equal(outs[0][1], outs[1][1])
    assert outs[0][2] == outs[1][2]
    assert outs[0][3] == [True] * 4 and outs[1][3] == [False] * 4     # generate() restores the modes


def test_spec_carries_p():
    s = to_spec(mf.Sequential([mf.DecoderBlock(8, 2, 16, dropout=0.3)]))
    assert s["layers"][0]["dropout"] == 0.3
    back = from_spec(s)[0]
    assert back.dropout == 0.3 and back.cross_attn.dropout == 0.3 and back.drop3.p == 0.3
    t = mf.Transformer(7, 9, 8, 2, 16, dropout=0.15)
    st = to_spec(t)
    assert st["dropout"] == 0.15
    back = from_spec(st)
    assert back.dropout == 0.15 and back.decoder[0].dropout == 0.15 and back.src_pos.dropout == 0.15
    plain = to_spec(mf.Sequential([mf.DecoderBlock(8, 2, 16)]))
    assert "dropout" not in plain["layers"][0]
    assert "dropout" not in to_spec(mf.Transformer(7, 9, 8, 2, 16))


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"DecoderBlock: dropout must be a number in \[0, 1\], got 1.5"):
        mf.DecoderBlock(8, 2, 16, dropout=1.5)
    with pytest.raises(ValueError, match=r"Transformer: dropout must be a number in \[0, 1\], got 'a'"):
        mf.Transformer(7, 9, 8, 2, 16, dropout="a")


def test_same_seed_same_masks_on_every_interpreter(micropython):
    want = helpers.run_cpython(helpers.script("decoder_dropout_mp.py"), "python")
    assert "eval identity ok" in want and want.count("\n") == 8
    for backend in ("python", "viper"):
        got = helpers.run_micropython(helpers.script("decoder_dropout_mp.py"), backend, exe=micropython)
        assert got == want, "%s masks differ from CPython's:\n%s\nvs\n%s" % (backend, got, want)


# ---- against torch ---------------------------------------------------------------------------

torch = pytest.importorskip("torch") if not os.environ.get("CI") else __import__("torch")


def _torch_layer(seed, p=0.2):
    torch.manual_seed(seed)
    tm = torch.nn.TransformerDecoderLayer(8, 2, 16, dropout=p, activation="gelu", batch_first=True,
                                          norm_first=True)
    with torch.no_grad():
        for q in tm.parameters():
            q.uniform_(-0.5, 0.5)
    return tm


def test_torch_eval_mode_equal(backend):
    import torch_io
    tm = _torch_layer(1).eval()
    blk = torch_io.from_torch(tm)
    assert blk.dropout == pytest.approx(0.2) and blk.self_attn.dropout == pytest.approx(0.2)
    assert blk.cross_attn.dropout == pytest.approx(0.2) and blk.ffn.dropout == pytest.approx(0.2)
    blk.eval()
    _, xa = _t((3, 6, 8), 17)
    _, ma = _t((3, 4, 8), 18)
    causal = torch.ones(6, 6, dtype=torch.bool).triu(1)
    want = tm(torch.tensor(xa), torch.tensor(ma), tgt_mask=causal).detach().numpy()
    got = _np(blk.forward(Tensor.from_list(xa.tolist()), Tensor.from_list(ma.tolist())))
    assert helpers.rel_err(got, want) <= 1e-5
    back = torch_io.to_torch(blk)
    assert back.dropout.p == pytest.approx(0.2) and back.dropout3.p == pytest.approx(0.2)
    assert back.multihead_attn.dropout == pytest.approx(0.2)


def test_torch_train_statistics():
    """Masks differ between the generators; the mean of many train-mode outputs is near the eval
    output on both sides, and one draw is far from it (NumPy backend: the masks are the backends')."""
    import torch_io
    tm = _torch_layer(2, 0.3)
    blk = torch_io.from_torch(tm)
    _, xa = _t((1, 5, 8), 19)
    _, ma = _t((1, 4, 8), 20)
    xt, mt = torch.tensor(xa), torch.tensor(ma)
    xm, mm = Tensor.from_list(xa.tolist()), Tensor.from_list(ma.tolist())
    causal = torch.ones(5, 5, dtype=torch.bool).triu(1)
    tm.eval()
    blk.eval()
    ev_t = tm(xt, mt, tgt_mask=causal).detach().numpy()
    ev_m = _np(blk.forward(xm, mm))
    assert helpers.rel_err(ev_m, ev_t) <= 1e-5
    tm.train()
    blk.train()
    N = 600
    with torch.no_grad():
        acc_t = sum(tm(xt, mt, tgt_mask=causal).numpy() for _ in range(N)) / N
        one_t = tm(xt, mt, tgt_mask=causal).numpy()
    acc_m = sum(_np(blk.forward(xm, mm)) for _ in range(N)) / N
    one_m = _np(blk.forward(xm, mm))
    spread_t, spread_m = helpers.rel_err(one_t, ev_t), helpers.rel_err(one_m, ev_m)
    assert spread_t > 0.05 and spread_m > 0.05
    # dropout before a LayerNorm and a GELU is not unbiased through them: compare the two sides'
    # biases instead, both small against one draw's spread
    assert helpers.rel_err(acc_t, ev_t) < spread_t / 2
    assert helpers.rel_err(acc_m, ev_m) < spread_m / 2
    assert helpers.rel_err(acc_m, acc_t) < min(spread_t, spread_m) / 4   # the same expectation


def test_torch_io_refuses_differing_dropouts():
    import torch_io
    odd = _torch_layer(3, 0.1)
    odd.dropout3.p = 0.3
    with pytest.raises(ValueError, match=r"TransformerDecoderLayer.*dropouts differ \(dropout=0.1, dropout1=0.1, "
                                         r"dropout2=0.1, dropout3=0.3, multihead_attn.dropout=0.1, "
                                         r"self_attn.dropout=0.1\); DecoderBlock\(dropout=p\) has one p for all 6"):
        torch_io.from_torch(odd)
    assert torch_io.from_torch(odd, ignore_dropout=True).dropout == 0.0
