"""Golden vectors (tests/oracles/golden_vectors.py -> tests/golden/attention.mfg): the file is current, its
invariants hold, and lib's Attention matches every stage on CPython and inside MicroPython."""

import numpy as np

import helpers
import golden_vectors as host_golden

PATH = host_golden.DEFAULT_PATH


def test_golden_file_is_current():
    problems = host_golden.stale(PATH, host_golden.attention_case())
    assert not problems, "tests/golden/attention.mfg is stale (%s): run python tests/oracles/golden_vectors.py" % problems


def test_a_stale_golden_file_is_seen(tmp_path):
    # one value moved by 2 float32 ulp, and a record renamed: both are reported
    rec = [(n, np.array(a, np.float32)) for n, a in host_golden.read(PATH)]
    moved = [(n, a.copy()) for n, a in rec]
    moved[4][1].flat[0] = np.nextafter(np.nextafter(moved[4][1].flat[0], np.float32(np.inf)), np.float32(np.inf))
    assert host_golden.stale(PATH, moved) == ["%s: 2 ulp apart" % rec[4][0]]
    one = [(n, a.copy()) for n, a in rec]
    one[4][1].flat[0] = np.nextafter(one[4][1].flat[0], np.float32(np.inf))
    assert host_golden.stale(PATH, one) == []
    renamed = [("other" if i == 3 else n, a) for i, (n, a) in enumerate(rec)]
    assert host_golden.stale(PATH, renamed)[0].startswith("records differ")


def test_golden_format_and_invariants():
    rec = host_golden.read(PATH)
    names = [n for n, _ in rec]
    assert names[:3] == ["config", "mask", "x"]
    assert names[-9:] == ["dx", "dWq", "dbq", "dWk", "dbk", "dWv", "dbv", "dWo", "dbo"]
    r = dict(rec)
    B, S, E, H, causal, _ = [int(v) for v in r["config"]]
    D = E // H
    A, mask = r["weights"].astype(np.float64), r["mask"].astype(bool)
    hidden = np.zeros((B, 1, S, S), dtype=bool)
    if causal:
        hidden |= np.triu(np.ones((S, S), dtype=bool), 1)[None, None]
    hidden |= mask[:, None, None, :]
    assert hidden.any() and mask.any() and causal
    assert (A[np.broadcast_to(hidden, A.shape)] == 0.0).all(), "hidden keys weigh exactly 0"
    np.testing.assert_allclose(A.sum(-1), 1.0, atol=1e-6)
    masked = r["scores_masked"]
    assert np.isneginf(masked[np.broadcast_to(hidden, A.shape)]).all()
    np.testing.assert_allclose(r["scores_scaled"], r["scores_raw"] / np.sqrt(D), rtol=1e-6, atol=1e-6)
    vis = ~np.broadcast_to(hidden, A.shape)
    np.testing.assert_array_equal(masked[vis], r["scores_scaled"][vis])


def test_golden_lib_cpython():
    from microformer import golden
    errors, problems = golden.check_attention(PATH, "python")
    assert problems == []
    assert max(errors.values()) <= 1e-4, errors


def test_golden_lib_micropython(tmp_path, micropython):
    out = helpers.run_micropython(helpers.script("golden_mp.py"), PATH, exe=micropython)
    assert "GOLDEN OK" in out, out


def test_golden_reader_rejects_damage(tmp_path):
    from microformer import golden
    import pytest
    data = open(PATH, "rb").read()
    bad = tmp_path / "bad.mfg"
    bad.write_bytes(b"XXXX" + data[4:])
    with pytest.raises(ValueError, match="not a golden-vector file"):
        golden.read(str(bad))
    bad.write_bytes(data[:-7])
    with pytest.raises(ValueError, match="truncated"):
        golden.read(str(bad))


def test_new_reference_functions_gradcheck():
    """The family's reference backward passes agree with finite differences."""
    import reference as ref
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 3, 4))
    dy = rng.normal(size=(2, 3, 4))
    g, b = rng.normal(1, .2, 4), rng.normal(size=4)
    _, c = ref.layernorm_forward(x, g, b)
    dx, dg, _ = ref.layernorm_backward(dy, c)
    np.testing.assert_allclose(dx, ref.gradcheck(lambda: ref.layernorm_forward(x, g, b)[0], x, dy), atol=1e-6)
    np.testing.assert_allclose(dg, ref.gradcheck(lambda: ref.layernorm_forward(x, g, b)[0], g, dy), atol=1e-6)
    p = {"ln1.gamma": g, "ln1.beta": b, "ln2.gamma": g[::-1].copy(), "ln2.beta": b[::-1].copy(),
         "ffn.W1": rng.normal(size=(6, 4)), "ffn.b1": rng.normal(size=6),
         "ffn.W2": rng.normal(size=(4, 6)), "ffn.b2": rng.normal(size=4)}
    for n in ("Wq", "Wk", "Wv", "Wo"):
        p["attn." + n] = rng.normal(scale=.5, size=(4, 4))
        p["attn.b" + n[1].lower()] = rng.normal(scale=.2, size=4)
    f = lambda: ref.encoder_block_forward(x, p, 2, causal=True, key_padding_mask=[[0, 0, 1], [0, 0, 0]])[0]
    _, c = ref.encoder_block_forward(x, p, 2, causal=True, key_padding_mask=[[0, 0, 1], [0, 0, 0]])
    dx, grads = ref.encoder_block_backward(dy, c, p)
    np.testing.assert_allclose(dx, ref.gradcheck(f, x, dy), atol=1e-5)
    for n in ("ffn.W1", "attn.Wk", "ln2.gamma", "attn.bq"):
        np.testing.assert_allclose(grads["d" + n], ref.gradcheck(f, p[n], dy), atol=1e-5)
    ids = np.array([[1, 1, 2]])
    W = rng.normal(size=(3, 4))
    dyE = rng.normal(size=(1, 3, 4))
    np.testing.assert_allclose(ref.embedding_backward(dyE, ids, 3),
                               ref.gradcheck(lambda: ref.embedding_forward(ids, W), W, dyE), atol=1e-6)
    pe = ref.positional_encoding(5, 6)
    assert pe[0, 0] == 0 and pe[0, 1] == 1 and abs(pe[3, 2] - np.sin(3 * np.exp(-2 * np.log(1e4) / 6))) < 1e-12
