"""Long sequences in little memory: the key-tiled attention (Attention(..., kv_tile=T)) against the
standard path and the NumPy reference (forward and every gradient, masks included), on both CPython
backends and inside both MicroPython ports; S=512 in a 32-bit heap where the standard path raises
MemoryError; and the streaming encoder against the full attention with the block-banded mask."""
import re

import numpy as np
import pytest

import helpers
import microformer as mf
import reference as ref
from microformer.spec import from_spec, to_spec
from microformer.tensor import Tensor

TOL = 1e-5        # tiled vs standard, float32 (measured <= 3e-7 on CPython and the 32-bit port)


def _t(shape, seed, scale=1.0):
    a = (np.random.default_rng(seed).uniform(-1, 1, size=shape) * scale).astype(np.float32)
    return Tensor.from_list(a.tolist()), a.astype(np.float64)


def _np(t):
    return np.array(t.data, dtype=np.float64).reshape(t.shape)


def _run(kv_tile, causal, lengths, context, S=9, Sk=None, B=2, E=8, H=2, seed=4):
    mf.seed(seed)
    a = mf.Attention(E, H, causal=causal, kv_tile=kv_tile)
    x, _ = _t((B, S, E), 1)
    c = _t((B, Sk, E), 3)[0] if context else None
    y = a.forward(x, context=c, lengths=lengths)
    dx = a.backward(_t((B, S, E), 2)[0])
    dc = a.dcontext
    assert (dc is None) == (not context)
    res = {"y": _np(y), "dx": _np(dx)}
    if dc is not None:
        res["dc"] = _np(dc)
    for n in ("Wq", "Wk", "Wv", "Wo", "bq", "bk", "bv", "bo"):
        res["d" + n] = _np(getattr(a, "d" + n))
    return res, a


def _same(got, want):
    # dbk is 0 in exact arithmetic (softmax ignores a shift shared by all keys): its round-off
    # is judged at the case's scale, every other output relative to its own largest value
    assert set(got) == set(want)
    scale = max(float(np.abs(v).max()) for v in want.values())
    for k in want:
        err = (float(np.abs(got[k] - want[k]).max()) / scale if k == "dbk"
               else helpers.rel_err(got[k], want[k]))
        assert err <= TOL, (k, err)


CASES = [
    # kv_tile, causal, lengths, context (Sk)
    (1, False, None, None), (4, False, None, None), (64, False, None, None),
    (3, True, None, None), (2, False, [9, 4], None), (5, True, [6, 9], None),
    (4, False, [0, 9], None),                    # a sequence with every key padded
    (3, False, None, 13), (4, True, None, 12), (5, False, [13, 2], 13),
]


@pytest.mark.parametrize("kv_tile,causal,lengths,sk", CASES)
def test_tiled_equals_standard(backend, kv_tile, causal, lengths, sk):
    want, std = _run(None, causal, lengths, sk is not None, Sk=sk)
    got, tiled = _run(kv_tile, causal, lengths, sk is not None, Sk=sk)
    _same(got, want)
    assert tiled._A is None and std._A is not None          # no [B,H,S,Sk] buffer at all
    assert tiled.cache_floats((2, 9, 8)) < std.cache_floats((2, 9, 8))


def test_tiled_against_the_reference(backend):
    S, E, H = 10, 8, 2
    mf.seed(5)
    a = mf.Attention(E, H, causal=True, kv_tile=3)
    x, xa = _t((2, S, E), 6)
    dy, dya = _t((2, S, E), 7)
    pad = [[0] * S, [0] * 7 + [1] * 3]
    y = _np(a.forward(x, key_padding_mask=pad))
    dx = _np(a.backward(dy))
    p = {n: _np(getattr(a, n)) for n in ("Wq", "Wk", "Wv", "Wo", "bq", "bk", "bv", "bo")}
    ry, cache = ref.attention_forward(xa, p, H, causal=True, key_padding_mask=np.array(pad, dtype=bool))
    rdx, g, _ = ref.attention_backward(dya, cache, p)
    helpers.assert_close(y, ry, 1e-5, "y")
    helpers.assert_close(dx, rdx, 1e-5, "dx")
    for n in ("Wq", "Wk", "Wv", "Wo"):
        helpers.assert_close(_np(getattr(a, "d" + n)), g["d" + n], 1e-5, "d" + n)


def test_encoder_block_with_kv_tile(backend):
    outs = []
    for kv_tile in (None, 4):
        mf.seed(6)
        blk = mf.EncoderBlock(8, 2, 16, causal=True, kv_tile=kv_tile)
        y = _np(blk.forward(_t((2, 11, 8), 8)[0], lengths=[11, 5]))
        dx = _np(blk.backward(_t((2, 11, 8), 9)[0]))
        outs.append([y, dx] + [_np(g) for _, g in blk.params()])
    assert len(outs[1]) == len(outs[0]) == 18
    names = ["y", "dx"] + ["d%d" % i for i in range(16)]
    mf_names = [p.name for p, _ in blk.params()]
    _same({n if mf_names[i - 2:i - 1] != ["attn.bk"] else "dbk": v for i, (n, v) in enumerate(zip(names, outs[1]))},
          {n if mf_names[i - 2:i - 1] != ["attn.bk"] else "dbk": v for i, (n, v) in enumerate(zip(names, outs[0]))})


def test_tiled_bad_input_and_limits():
    for bad in (0, -2, 2.5, "4", True):
        with pytest.raises(ValueError, match="Attention: kv_tile must be a positive int \\(keys per tile\\) or None, got"):
            mf.Attention(8, 2, kv_tile=bad)
    with pytest.raises(ValueError, match="Attention: dropout=0.1 needs the stored attention weights, which kv_tile=4"):
        mf.Attention(8, 2, dropout=0.1, kv_tile=4)
    a = mf.Attention(8, 2, kv_tile=4)
    a.forward(_t((1, 5, 8), 1)[0])
    with pytest.raises(ValueError, match=r"Attention: weights\(\) needs the stored attention weights, which kv_tile=4"):
        a.weights()
    with pytest.raises(ValueError, match=r"Attention: stages\(\) needs the stored"):
        a.stages()
    # a score beyond float32: the standard path rescales the row, the tiled one says so
    mf.set_backend("python")
    big = mf.Attention(8, 2, kv_tile=4)
    for n in ("Wq", "Wk"):
        getattr(big, n).data[:] = Tensor.from_list(np.eye(8).ravel().tolist()).data
    with pytest.raises(OverflowError, match="attention_forward_tiled: a score q.k/sqrt\\(D\\) is beyond float32"):
        big.forward(_t((1, 3, 8), 2, scale=1e20)[0])
    mf.set_backend("numpy")
    with pytest.raises(OverflowError, match="beyond float32"):
        big.forward(_t((1, 3, 8), 2, scale=1e20)[0])


def test_spec_carries_kv_tile():
    m = mf.Sequential([mf.Attention(8, 2, kv_tile=16), mf.EncoderBlock(8, 2, 16, kv_tile=8)])
    s = to_spec(m)
    assert s["layers"][0]["kv_tile"] == 16 and s["layers"][1]["kv_tile"] == 8
    back = from_spec(s)
    assert back[0].kv_tile == 16 and back[1].attn.kv_tile == 8


def test_inside_micropython(micropython):
    for backend, tol_tiled, tol_stream in (("python", TOL, 1e-6), ("viper", 1e-3, 1e-3)):
        out = helpers.run_micropython(helpers.script("longseq_mp.py"), backend, exe=micropython)
        tiled = [float(v) for v in re.findall(r"^tiled .* rel (\S+)$", out, re.M)]
        stream = [float(v) for v in re.findall(r"^stream rel (\S+)$", out, re.M)]
        assert len(tiled) == 4 and len(stream) == 1, out
        # python: both paths portable; viper: the standard path is viper's (its 1e-3 output bound)
        assert max(tiled) <= tol_tiled, (backend, out)
        assert stream[0] <= tol_stream, (backend, out)


# S=512, E=32, H=2, batch 1: the standard path holds 2.9 MB live (the [1,2,512,512] weights alone
# are 2 MB, allocated as one block; it runs in a 3 MB heap since the imports leave the heap in one
# piece); the tiled path holds 0.92 MB (both ports: the buffers are array('f')) and runs from about
# 2 MB. In a 2.5 MB heap one runs and the other cannot.
HEAP = "2560K"


def test_s512_fits_where_the_standard_path_cannot(micropython):
    out = helpers.run_micropython(helpers.script("longseq_heap_mp.py"), 512, 32, 2, 64, "viper",
                                  heap=HEAP, exe=micropython)
    m = re.search(r"peak (\d+) bytes", out)
    assert m and int(m.group(1)) < 1200000, out
    assert "time forward" in out
    import subprocess
    proc = subprocess.run([micropython, "-X", "heapsize=" + HEAP, helpers.script("longseq_heap_mp.py"),
                           "512", "32", "2", "0", "python"], capture_output=True, text=True, timeout=600,
                          env=helpers.micropython_env(), cwd=helpers.ROOT)
    assert proc.returncode != 0 and "MemoryError" in proc.stdout + proc.stderr, proc.stdout + proc.stderr


# ---- streaming ---------------------------------------------------------------------------

def _banded(S, chunks, window, causal):
    """[S, S] visible: query t of the chunk at p0 sees keys max(0, p0 - window) .. p0 + c - 1 (.. t)."""
    vis = np.zeros((S, S), dtype=bool)
    p0 = 0
    for c in chunks:
        for t in range(p0, p0 + c):
            vis[t, max(0, p0 - window):(t + 1 if causal else p0 + c)] = True
        p0 += c
    return vis


def _params(layer):
    return {p.name: _np(p) for p, _ in layer.params()}


def _stream(model, x, chunks, window):
    enc = mf.StreamingEncoder(model, window, max(chunks))
    outs = []
    p0 = 0
    for c in chunks:
        outs.append(_np(enc.step(Tensor.from_list(x[:, p0:p0 + c].tolist()))))
        p0 += c
    assert enc.pos == x.shape[1]
    return np.concatenate(outs, axis=1), enc


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window,chunks", [(4, [3, 3, 2, 3, 1]), (0, [2, 3, 3, 4]), (5, [4, 4, 4]),
                                           (64, [5, 7])])
def test_stream_equals_banded_attention(backend, causal, window, chunks):
    S = sum(chunks)
    mf.seed(7)
    pe = mf.PositionalEncoding(32, 8)
    b1 = mf.EncoderBlock(8, 2, 16, causal=causal)
    b2 = mf.EncoderBlock(8, 2, 16, activation="relu", causal=causal)
    model = mf.Sequential([pe, b1, b2])
    _, xa = _t((2, S, 8), 10)
    got, _ = _stream(model, xa, chunks, window)
    vis = _banded(S, chunks, window, causal)
    h = xa + ref.positional_encoding(32, 8)[:S]
    h = ref.encoder_block_forward(h, _params(b1), 2, causal=causal, visible_mask=vis)[0]
    want = ref.encoder_block_forward(h, _params(b2), 2, causal=causal, kind="relu", visible_mask=vis)[0]
    helpers.assert_close(got, want, 1e-5, "stream vs banded reference")
    # the band matters: without it (full attention) the outputs differ, unless the window covers all
    full = ref.encoder_block_forward(ref.encoder_block_forward(xa + ref.positional_encoding(32, 8)[:S],
                                                               _params(b1), 2, causal=causal)[0],
                                     _params(b2), 2, causal=causal, kind="relu")[0]
    if not (causal and window >= S):
        assert helpers.rel_err(got, full) > 1e-3


def test_stream_attention_layer_and_reset(backend):
    mf.seed(8)
    attn = mf.Attention(8, 2)
    _, xa = _t((1, 10, 8), 11)
    got, enc = _stream(attn, xa, [4, 4, 2], 3)
    vis = _banded(10, [4, 4, 2], 3, False)
    want = ref.attention_forward(xa, {n: _np(getattr(attn, n)) for n in ("Wq", "Wk", "Wv", "Wo", "bq", "bk", "bv", "bo")},
                                 2, visible_mask=vis)[0]
    helpers.assert_close(got, want, 1e-5, "attention stream")
    enc.reset()
    assert enc.pos == 0
    again = _np(enc.step(Tensor.from_list(xa[:, :4].tolist())))
    helpers.assert_close(again, want[:, :4], 1e-5, "after reset")


def test_stream_bad_input():
    mf.seed(9)
    with pytest.raises(ValueError, match="StreamingEncoder: window must be an int >= 0, got -1"):
        mf.StreamingEncoder(mf.Attention(8, 2), -1, 4)
    with pytest.raises(ValueError, match="StreamingEncoder: chunk must be an int >= 1, got 0"):
        mf.StreamingEncoder(mf.Attention(8, 2), 4, 0)
    with pytest.raises(ValueError, match="StreamingEncoder: layer 1 is a GlobalAvgPool, which mixes or reshapes"):
        mf.StreamingEncoder(mf.Sequential([mf.Attention(8, 2), mf.GlobalAvgPool()]), 4, 4)
    enc = mf.StreamingEncoder(mf.Attention(8, 2), 4, 4)
    with pytest.raises(ValueError, match=r"StreamingEncoder: x must be \[B, c, ...\] with 1 <= c <= chunk=4, got \(1, 5, 8\)"):
        enc.step(Tensor.zeros((1, 5, 8)))
    enc.step(Tensor.zeros((1, 2, 8)))
    with pytest.raises(ValueError, match="StreamingEncoder: this stream has batch 1, got a chunk of batch 2"):
        enc.step(Tensor.zeros((2, 2, 8)))
    blk = mf.EncoderBlock(8, 2, 16, dropout=0.1)
    enc = mf.StreamingEncoder(blk, 4, 4)
    with pytest.raises(ValueError, match="StreamingEncoder: the model has dropout in training mode; call model.eval"):
        enc.step(Tensor.zeros((1, 2, 8)))
    blk.eval()
    assert enc.step(Tensor.zeros((1, 2, 8))).shape == (1, 2, 8)
