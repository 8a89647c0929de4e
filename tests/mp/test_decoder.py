"""DecoderBlock against the NumPy reference (gradchecked) on CPython and inside MicroPython (portable
and viper backends), against torch.nn.TransformerDecoderLayer via state_dict (CPython), the
Transformer's cached greedy generation against its full forward, padded batched decoding against
one prompt at a time, and bad input."""
import json

import numpy as np
import pytest

import helpers
from helpers import assert_close
import decoder_mp
import microformer as mf
import reference as ref

TOL = 1e-4
VIPER_TOL = 5e-3       # the viper backend's bound (block floating point), as for the encoder family
E, H, HID = 8, 2, 12


def _f32(a):
    return np.asarray(a, dtype=np.float32).astype(np.float64)


def _lengths_mask(lengths, S):
    return np.arange(S)[None, :] >= np.asarray(lengths)[:, None]


def _block_case(seed, B=2, S=5, Sk=4, tgt_lengths=None, memory_lengths=None, kind="gelu"):
    rng = np.random.default_rng(seed)
    blk = mf.DecoderBlock(E, H, HID)
    params = {}
    for p, _ in blk.params():
        params[p.name] = _f32(rng.uniform(-0.5, 0.5, p.shape))
    x = _f32(rng.uniform(-1, 1, (B, S, E)))
    m = _f32(rng.uniform(-1, 1, (B, Sk, E)))
    dy = _f32(rng.uniform(-1, 1, (B, S, E)))
    case = {"kind": "block", "E": E, "H": H, "hidden": HID, "activation": kind,
            "params": {k: v.ravel().tolist() for k, v in params.items()},
            "x": {"shape": [B, S, E], "data": x.ravel().tolist()},
            "memory": {"shape": [B, Sk, E], "data": m.ravel().tolist()},
            "dy": {"shape": [B, S, E], "data": dy.ravel().tolist()},
            "tgt_lengths": tgt_lengths, "memory_lengths": memory_lengths}
    tm = None if tgt_lengths is None else _lengths_mask(tgt_lengths, S)
    mm = None if memory_lengths is None else _lengths_mask(memory_lengths, Sk)
    y, cache = ref.decoder_block_forward(x, m, params, H, tm, mm, kind)
    dx, dmem, g = ref.decoder_block_backward(dy, cache, params)
    want = {"y": y.ravel(), "dx": dx.ravel(), "dmemory": dmem.ravel()}
    for k, v in g.items():
        want[k] = v.ravel()
    return case, want


CASES = [("plain", dict(seed=1)),
         ("padded tgt + memory", dict(seed=2, tgt_lengths=[5, 3], memory_lengths=[2, 4])),
         ("one token", dict(seed=3, B=1, S=1, Sk=3, memory_lengths=[3]))]


def test_reference_gradcheck():
    """The reference's hand-written backward against central differences (masks included)."""
    rng = np.random.default_rng(7)
    B, S, Sk, e, h, hid = 2, 3, 4, 4, 2, 6
    names = {"ln1.gamma": (e,), "ln1.beta": (e,), "ln2.gamma": (e,), "ln2.beta": (e,),
             "ln3.gamma": (e,), "ln3.beta": (e,), "ffn.W1": (hid, e), "ffn.b1": (hid,),
             "ffn.W2": (e, hid), "ffn.b2": (e,)}
    for a in ("self_attn.", "cross_attn."):
        for n in "qkvo":
            names[a + "W" + n] = (e, e)
            names[a + "b" + n] = (e,)
    p = {k: rng.uniform(-0.8, 0.8, s) for k, s in names.items()}
    x = rng.uniform(-1, 1, (B, S, e))
    m = rng.uniform(-1, 1, (B, Sk, e))
    dy = rng.uniform(-1, 1, (B, S, e))
    tm = _lengths_mask([3, 2], S)
    mm = _lengths_mask([4, 2], Sk)
    f = lambda: ref.decoder_block_forward(x, m, p, h, tm, mm)[0]
    _, cache = ref.decoder_block_forward(x, m, p, h, tm, mm)
    dx, dmem, g = ref.decoder_block_backward(dy, cache, p)
    assert_close(dx, ref.gradcheck(f, x, dy), 1e-6, "dx")
    assert_close(dmem, ref.gradcheck(f, m, dy), 1e-6, "dmemory")
    # padded memory rows get no gradient at all
    assert np.all(dmem[1, 2:] == 0)
    for k in names:
        num = ref.gradcheck(f, p[k], dy)
        if k.endswith(".bk"):        # 0 in theory: softmax ignores a shift shared by every key
            assert np.abs(g["d" + k]).max() < 1e-8 and np.abs(num).max() < 1e-6, k
        else:
            assert_close(g["d" + k], num, 1e-6, "d" + k)


@pytest.mark.parametrize("backend", ["python", "numpy"])
@pytest.mark.parametrize("name,kw", CASES, ids=[c[0] for c in CASES])
def test_block_cpython(backend, name, kw):
    case, want = _block_case(**kw)
    mf.set_backend(backend)
    try:
        got = decoder_mp.run_block(case)
    finally:
        mf.set_backend("numpy")
    helpers.check_outputs(got, want, TOL, "%s %s" % (backend, name))


def _run_mp(cases, tmp_path, backend, exe, heap="8M"):
    src = tmp_path / ("dec-%s.json" % backend)
    dst = tmp_path / ("dec-out-%s.json" % backend)
    src.write_text(json.dumps(cases))
    helpers.run_micropython(helpers.script("decoder_mp.py"), str(src), str(dst), backend, heap=heap, exe=exe)
    return json.loads(dst.read_text())


@pytest.mark.parametrize("backend,tol", [("python", TOL), ("viper", VIPER_TOL)])
def test_block_micropython(tmp_path, micropython, backend, tol):
    built = [_block_case(**kw) for _, kw in CASES]
    got = _run_mp([c for c, _ in built], tmp_path, backend, micropython)
    assert len(got) == len(built)
    for (name, _), g, (_, want) in zip(CASES, got, built):
        helpers.check_outputs(g, want, tol, "micropython %s %s" % (backend, name))


# ---------------------------------------------------------------- generation

GEN_SPEC = {"type": "Transformer", "src_vocab": 9, "tgt_vocab": 7, "embed_dim": 8, "num_heads": 2,
            "ffn_hidden": 16, "num_encoder_layers": 2, "num_decoder_layers": 2, "max_len": 12}


def _gen_case():
    return {"kind": "generate", "seed": 5, "spec": GEN_SPEC, "bos": 1, "max_new": 6,
            "src": [[3, 4, 5, 6, 7], [8, 2, 0, 0, 0], [5, 5, 3, 0, 0]], "src_lengths": [5, 2, 3]}


def _check_generation(got, what):
    for b in range(len(got["batch"])):
        assert len(got["batch"][b]) == 6, what
        # the cached decoding's token at every step is the full forward's argmax there
        assert got["batch"][b] == got["full"][b], "%s sample %d: cached %s vs full %s" % (
            what, b, got["batch"][b], got["full"][b])
        # a padded batch decodes each source as it decodes alone
        assert got["batch"][b] == got["single"][b], "%s sample %d: batch %s vs alone %s" % (
            what, b, got["batch"][b], got["single"][b])
    # not a constant output: the check above would be trivially met by a model ignoring its input
    assert len(set(tuple(r) for r in got["batch"])) > 1, "%s: every source decodes alike" % what


@pytest.mark.parametrize("backend", ["python", "numpy"])
def test_generation_cpython(backend):
    mf.set_backend(backend)
    try:
        got = decoder_mp.run_generate(_gen_case())
    finally:
        mf.set_backend("numpy")
    _check_generation(got, backend)


@pytest.mark.parametrize("backend", ["python", "viper"])
def test_generation_micropython(tmp_path, micropython, backend):
    got = _run_mp([_gen_case()], tmp_path, backend, micropython)[0]
    _check_generation(got, "micropython " + backend)
    want = decoder_mp.run_generate(_gen_case())
    assert got["batch"] == want["batch"], "MicroPython %s vs CPython: %s vs %s" % (backend, got["batch"], want["batch"])


def _padded_case():
    rng = np.random.default_rng(11)
    B, S, T = 3, 4, 3
    return {"kind": "padded", "seed": 3, "E": E, "H": H, "L": 8, "lengths": [4, 1, 2],
            "x": {"shape": [B, S, E], "data": _f32(rng.uniform(-1, 1, (B, S, E))).ravel().tolist()},
            "steps": {"shape": [B, T, E], "data": _f32(rng.uniform(-1, 1, (B, T, E))).ravel().tolist()}}


def _check_padded(got, tol, what):
    batch = np.asarray(got["batch"])            # [T, B*E]
    T = batch.shape[0]
    for b, rows in enumerate(got["alone"]):
        for t in range(T):
            assert_close(batch[t][b * E:(b + 1) * E], rows[t], tol, "%s sample %d step %d" % (what, b, t))


@pytest.mark.parametrize("backend", ["python", "numpy"])
def test_padded_decoding_cpython(backend):
    mf.set_backend(backend)
    try:
        got = decoder_mp.run_padded_attention(_padded_case())
    finally:
        mf.set_backend("numpy")
    _check_padded(got, TOL, backend)


@pytest.mark.parametrize("backend,tol", [("python", TOL), ("viper", VIPER_TOL)])
def test_padded_decoding_micropython(tmp_path, micropython, backend, tol):
    got = _run_mp([_padded_case()], tmp_path, backend, micropython)[0]
    _check_padded(got, tol, "micropython " + backend)


def _block_padded_case():
    rng = np.random.default_rng(12)
    B, S, Sk = 3, 4, 5
    c = _padded_case()
    c.update({"kind": "block_padded", "lengths": [2, 4, 1], "memory_lengths": [5, 2, 3],
              "x": {"shape": [B, S, E], "data": _f32(rng.uniform(-1, 1, (B, S, E))).ravel().tolist()},
              "memory": {"shape": [B, Sk, E], "data": _f32(rng.uniform(-1, 1, (B, Sk, E))).ravel().tolist()}})
    return c


def _check_block_padded(got, tol, what):
    _check_padded(got, tol, what)
    for b in range(3):
        assert_close(got["prefill_last"][b], got["alone_prefill_last"][b], tol, "%s prefill sample %d" % (what, b))


@pytest.mark.parametrize("backend", ["python", "numpy"])
def test_block_padded_decoding_cpython(backend):
    mf.set_backend(backend)
    try:
        got = decoder_mp.run_block_padded(_block_padded_case())
    finally:
        mf.set_backend("numpy")
    _check_block_padded(got, TOL, backend)


@pytest.mark.parametrize("backend,tol", [("python", TOL), ("viper", VIPER_TOL)])
def test_block_padded_decoding_micropython(tmp_path, micropython, backend, tol):
    got = _run_mp([_block_padded_case()], tmp_path, backend, micropython)[0]
    _check_block_padded(got, tol, "micropython " + backend)


def test_transformer_trains_and_round_trips_spec(tmp_path):
    """A few Adam steps lower the loss (every grad reaches its weights), and a checkpoint with the
    spec rebuilds the same model."""
    mf.seed(2)
    t = mf.from_spec(GEN_SPEC)
    src = [[3, 4, 5, 6], [8, 2, 0, 0]]
    tgt = [[1, 6, 5, 4], [1, 2, 3, 0]]
    labels = [6, 5, 4, 3, 2, 3, 0, 0]
    opt = mf.Adam(t.parameters(), lr=0.03)
    loss = mf.CrossEntropyLoss()
    first = None
    for _ in range(30):
        opt.zero_grad()
        logits = t.forward(src, tgt, [4, 2], [4, 3])
        flat = mf.Tensor((8, 7), logits.data)
        v = loss.forward(flat, labels)
        first = v if first is None else first
        t.backward(mf.Tensor(logits.shape, loss.backward().data))
        opt.step()
    assert v < 0.2 * first, "loss %.4f -> %.4f" % (first, v)
    every = [g for _, g in t.params()]
    assert all(max(abs(x) for x in g.data) > 0 for g in every if g.name not in ("dbk",)), "a zero grad"
    path = str(tmp_path / "t.mfck")
    mf.save_checkpoint(path, t, meta={"spec": mf.to_spec(t)})
    t2 = mf.load_model(path)
    a = list(t.forward(src, tgt, [4, 2]).data)
    b = list(t2.forward(src, tgt, [4, 2]).data)
    assert a == b


def _backward_after_generate():
    t = mf.from_spec(GEN_SPEC)
    y = t.forward([[1, 2]], [[1, 3]])
    t.generate([[1, 2]], max_new=3)
    t.backward(mf.Tensor(y.shape))


BAD = [
    ("memory width", lambda: mf.DecoderBlock(8, 2, 12).forward(mf.Tensor((1, 3, 8)), mf.Tensor((1, 2, 6))),
     "DecoderBlock: memory must be [B,S,8], got (1, 2, 6)"),
    ("memory batch", lambda: mf.DecoderBlock(8, 2, 12).forward(mf.Tensor((2, 3, 8)), mf.Tensor((1, 2, 8))),
     "DecoderBlock: memory must be [2,Sk,8], got (1, 2, 8)"),
    ("memory lengths", lambda: mf.DecoderBlock(8, 2, 12).forward(mf.Tensor((1, 3, 8)), mf.Tensor((1, 2, 8)),
                                                                  memory_lengths=[3]),
     "Attention: lengths[0] must be an int in [0, 2], got 3"),
    ("decode before prefill", lambda: mf.DecoderBlock(8, 2, 12).decode_step(mf.Tensor((1, 1, 8))),
     "DecoderBlock: decode_step() called before prefill()"),
    ("cross before cache", lambda: mf.Attention(8, 2).cross_step(mf.Tensor((1, 1, 8))),
     "Attention: cross_step() called before cache_context()"),
    ("padded decode before prefill", lambda: mf.Attention(8, 2, causal=True).decode_step_padded(mf.Tensor((1, 1, 8))),
     "Attention: decode_step_padded() called before prefill_padded()"),
    ("prefill_padded no lengths", lambda: mf.Attention(8, 2, causal=True).prefill_padded(mf.Tensor((1, 2, 8)), max_len=4),
     "Attention: prefill_padded needs lengths or key_padding_mask"),
    ("src lengths", lambda: mf.from_spec(GEN_SPEC).forward([[1, 2]], [[1]], [3]),
     "Transformer: src_lengths[0] must be an int in [1, 2], got 3"),
    ("tgt batch", lambda: mf.from_spec(GEN_SPEC).forward([[1, 2]], [[1], [2]]),
     "Transformer: tgt must have the batch size of src (1), got (2, 1)"),
    ("max_new", lambda: mf.from_spec(GEN_SPEC).generate([[1, 2]], max_new=13),
     "Transformer: max_new must be an int in [1, 12] (max_len), got 13"),
    ("bos", lambda: mf.from_spec(GEN_SPEC).generate([[1, 2]], bos=7, max_new=4),
     "Transformer: bos must be a token id in [0, 7), got 7"),
    ("src ids", lambda: mf.from_spec(GEN_SPEC).forward([1, 2], [[1]]),
     "Transformer: src ids must be token ids [B,S]"),
    ("vocab", lambda: mf.Transformer(0, 5, 8, 2, 16), "Transformer: src_vocab must be a positive int, got 0"),
    ("backward after generate", _backward_after_generate, "Transformer: backward() called before forward()"),
]


@pytest.mark.parametrize("name,fn,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_input(name, fn, msg):
    with pytest.raises(ValueError if "called before" not in msg else RuntimeError) as e:
        fn()
    assert msg in str(e.value)


def test_decoder_block_spec_round_trip():
    blk = mf.DecoderBlock(8, 2, 12, activation="gelu_tanh", max_len=16, use_bias=False)
    spec = mf.to_spec(blk)
    again = mf.from_spec(spec)
    assert mf.spec.same_architecture(mf.to_spec(again), spec)
    assert (again.self_attn.max_len, again.ffn.kind, again.self_attn.use_bias) == (16, "gelu_tanh", False)
    assert list(again.state_dict()) == list(blk.state_dict())


@pytest.mark.parametrize("backend", ["python", "numpy"])
def test_cross_step_masks_agree(backend):
    """cache_context with lengths, nested lists or bytes hides the same keys; cross_step equals
    the cross-attention forward with that mask."""
    mf.set_backend(backend)
    try:
        mf.seed(8)
        a = mf.Attention(8, 2)
        rng = np.random.default_rng(3)
        c = mf.Tensor((2, 4, 8), __import__("array").array("f", _f32(rng.uniform(-1, 1, 64)).tolist()))
        x = mf.Tensor((2, 1, 8), __import__("array").array("f", _f32(rng.uniform(-1, 1, 16)).tolist()))
        want = list(a.forward(x, None, c, [3, 1]).data)
        outs = []
        for kw in ({"key_padding_mask": bytes([0, 0, 0, 1, 0, 1, 1, 1])}, {"lengths": [3, 1]},
                   {"key_padding_mask": [[0, 0, 0, 1], [0, 1, 1, 1]]}):
            a.cache_context(c, **kw)
            outs.append(list(a.cross_step(x).data))
        a.cache_context(c)
        unmasked = list(a.cross_step(x).data)
    finally:
        mf.set_backend("numpy")
    for o in outs:
        assert_close(o, want, TOL, "cross_step")
    assert np.abs(np.asarray(unmasked) - np.asarray(want)).max() > 1e-3, "the mask made no difference"
