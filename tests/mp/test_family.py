"""The attention family (LayerNorm, FeedForward, Embedding, PositionalEncoding, EncoderBlock,
Attention lengths / cross / KV cache) vs the NumPy reference, on CPython and inside MicroPython."""
import copy
import numpy as np
import pytest

import helpers
from helpers import assert_close
import family_bad_mp
import family_cases
import driver_mp

CASES = family_cases.all_cases()
IDS = [c[0] for c in CASES]
TOL = 1e-4


def run_family_micropython(cases, tmp_path, exe):
    return helpers.run_cases_micropython(cases, tmp_path, exe=exe)


def _check_masking(name, case, got):
    """All-masked query rows: weights exactly 0, no NaN anywhere, and their dQ rows exactly 0."""
    for k, v in got.items():
        assert not any(x != x for x in v), "%s %s: NaN" % (name, k)
    lengths = case.get("lengths")
    if not lengths or "A" not in got or case["layer"]["type"] != "Attention":
        return
    B, S, E = case["x"]["shape"]
    H = case["layer"]["args"][1]
    Sk = len(got["A"]) // (B * H * S)
    A = np.array(got["A"]).reshape(B, H, S, Sk)
    for b, n in enumerate(lengths):
        assert (A[b, :, :, n:] == 0.0).all(), "%s: padded keys of item %d weigh exactly 0" % (name, b)
        if n == 0:
            assert (np.array(got["dQ"]).reshape(B, S, E)[b] == 0.0).all(), "%s: all-masked rows get no dQ" % name
    if case["layer"]["kwargs"].get("causal"):
        for i in range(S):
            assert (A[:, :, i, i + 1:] == 0.0).all(), "%s: future keys weigh exactly 0" % name


@pytest.mark.parametrize("name,case,want", CASES, ids=IDS)
def test_family_cpython(name, case, want):
    got = driver_mp.run_case(copy.deepcopy(case))
    helpers.check_outputs(got, want, TOL, name)
    _check_masking(name, case, got)


def test_family_micropython(tmp_path, micropython):
    results = run_family_micropython([dict(c[1], backend="python") for c in CASES], tmp_path, micropython)
    assert len(results) == len(CASES)
    for (name, case, want), got in zip(CASES, results, strict=True):
        helpers.check_outputs(got, want, TOL, "micropython " + name)
        _check_masking(name, case, got)


def test_family_micropython_viper(tmp_path, micropython):
    """The viper backend (block floating point where kernels_viper defines a kernel, the portable
    kernel elsewhere) within the viper tolerance."""
    cases = [dict(c[1], backend="viper") for c in CASES]
    results = run_family_micropython(cases, tmp_path, micropython)
    assert len(results) == len(CASES)
    for (name, case, want), got in zip(CASES, results, strict=True):
        helpers.check_outputs(got, want, 5e-3, "micropython viper " + name)


def test_grads_accumulate_in_block():
    name, case, want = CASES[-4]
    got = driver_mp.run_case(dict(copy.deepcopy(case), repeat=2))
    assert_close(got["dattn.Wq"], 2 * want["dattn.Wq"], TOL, "dattn.Wq twice")
    assert_close(got["dffn.W1"], 2 * want["dffn.W1"], TOL, "dffn.W1 twice")
    assert_close(got["dln1.gamma"], 2 * want["dln1.gamma"], TOL, "dln1.gamma twice")
    assert_close(got["dx"], want["dx"], TOL, "dx is written")


def test_embedding_grads_accumulate():
    name, case, want = CASES[5]
    got = driver_mp.run_case(dict(copy.deepcopy(case), repeat=3))
    assert_close(got["dW"], 3 * want["dW"], TOL, "dW after 3 passes")


def test_frozen_block_keeps_no_grads():
    import microformer as mf
    mf.seed(2)
    blk = mf.EncoderBlock(8, 2, 16)
    blk.trainable = False
    x = mf.Tensor((2, 3, 8)).fill(0.5)
    x.data[0] = -1.0
    y = blk.forward(x)
    dx = blk.backward(y)
    assert blk.collect_params([]) == []
    assert all(g.data is None for _, g in blk.params())        # frozen: no grad buffers
    assert any(v != 0.0 for v in dx.data)


def test_block_composes_in_sequential_and_names_are_unique():
    import microformer as mf
    mf.seed(1)
    model = mf.Sequential([mf.Dense(8, 16), mf.PositionalEncoding(8, 16), mf.EncoderBlock(16, 2, 32),
                           mf.EncoderBlock(16, 2, 32), mf.GlobalAvgPool(), mf.Dense(16, 10)])
    names = [n for n, _ in model.named_params()]
    assert len(names) == len(set(names))
    assert "2.attn.Wq" in names and "3.ffn.b2" in names
    x = mf.Tensor((3, 8, 8)).fill(0.1)
    logits = model.forward(x)
    assert logits.shape == (3, 10)
    loss = mf.CrossEntropyLoss()
    loss.forward(logits, [1, 2, 3])
    assert model.backward(loss.backward()).shape == (3, 8, 8)
    info = model.summary((3, 8, 8), show=False)
    assert info["params"] == model.param_count() > 0


def _decode_check(results):
    for (name, _), got in zip(family_cases.DECODE, results, strict=True):
        assert got["rel_err"] <= 1e-5, "%s: decoded vs full forward rel err %.3g" % (name, got["rel_err"])
        # the figure the library reports is what its cache holds per token
        assert got["kv_bytes_per_token"] == got["kv_cache_per_token"] > 0, (name, got["kv_bytes_per_token"])


def test_kv_cache_cpython():
    results = [driver_mp.run_case(copy.deepcopy(c)) for _, c in family_cases.DECODE]
    _decode_check(results)
    # float32 K and V rows of E values per block
    c = family_cases.DECODE[-1][1]
    assert results[-1]["kv_bytes_per_token"] == c["blocks"] * 2 * 4 * c["E"]


def test_kv_cache_micropython(tmp_path, micropython):
    cases = [dict(c, backend="python") for _, c in family_cases.DECODE]
    _decode_check(run_family_micropython(cases, tmp_path, micropython))


def test_kv_cache_micropython_viper(tmp_path, micropython):
    cases = [dict(c, backend="viper") for _, c in family_cases.DECODE]
    results = run_family_micropython(cases, tmp_path, micropython)
    assert len(results) == len(family_cases.DECODE)
    for (name, _), got in zip(family_cases.DECODE, results, strict=True):
        assert got["rel_err"] <= 5e-3, "%s viper: rel err %.3g" % (name, got["rel_err"])


EXPECTED_BAD = {
    "mask wrong batch": "Attention: key_padding_mask must be [B,Sk] = [2,4]",
    "mask row length": "Attention: key_padding_mask row 0 must have 4 entries",
    "mask wrong type": "Attention: key_padding_mask must be [B,Sk] = [2,4] (nested lists or 8 bytes), got int",
    "mask bytes length": "Attention: key_padding_mask must be [B,Sk] = [2,4], got 5 bytes",
    "lengths too long": "Attention: lengths[0] must be an int in [0, 4], got 5",
    "lengths wrong count": "Attention: lengths must be a list of B=2 ints",
    "mask and lengths": "Attention: give key_padding_mask or lengths, not both",
    "context embed size": "Attention: context must be [B,S,8], got (2, 5, 6)",
    "context batch": "Attention: context must be [2,Sk,8], got (3, 5, 8)",
    "decode past capacity": "Attention: KV cache is full: max_len=3",
    "decode non-causal": "Attention: decode_step needs causal=True",
    "prefill non-causal": "Attention: prefill needs causal=True",
    "block decode non-causal": "EncoderBlock.decode_step needs causal=True",
    "decode before prefill": "Attention: decode_step() called before prefill()",
    "prefill without capacity": "Attention: prefill needs a cache capacity",
    "prompt longer than cache": "Attention: max_len must be an int >= prompt length 3, got 2",
    "decode token shape": "Attention: x must be [1,1,8]",
    "token id out of range": "Embedding: token ids must be ints in [0, 10), got 10",
    "token id negative": "Embedding: token ids must be ints in [0, 10), got -1",
    "token id not an int": "Embedding: token ids must be ints in [0, 10), got 1.5",
    "ids wrong type": "Embedding: ids must be a Tensor of token ids [B,S]",
    "layernorm width": "LayerNorm: x must be [..., 8], got (2, 3, 6)",
    "feedforward width": "FeedForward: x must be [..., 8], got (2, 3, 6)",
    "posenc too long": "PositionalEncoding: positions 0..4 exceed max_len=4",
    "posenc width": "PositionalEncoding: x must be [B,S,8], got (1, 3, 6)",
    "block width": "EncoderBlock: x must be [B,S,8], got (1, 3, 6)",
    "block heads": "embed_dim 8 must be divisible by num_heads",
    "layernorm backward first": "LayerNorm: backward() called before forward()",
}


def _check_bad(got, where):
    assert set(got) == set(EXPECTED_BAD), set(got) ^ set(EXPECTED_BAD)
    for name, want in EXPECTED_BAD.items():
        assert want in got[name], "%s %s: %r does not contain %r" % (where, name, got[name], want)


def test_bad_input_cpython():
    _check_bad(family_bad_mp.run_all(), "cpython")


def test_bad_input_micropython(tmp_path, micropython):
    _check_bad(run_family_micropython([{"kind": "bad"}], tmp_path, micropython)[0], "micropython")


def test_show_heatmap():
    import microformer as mf
    from microformer.heatmap import heatmap
    assert heatmap([[0.0, 1.0, 0.5, 0.1]]) == [" @+."]
    mf.seed(1)
    a = mf.Attention(8, 2, causal=True)
    a.forward(mf.Tensor((1, 4, 8)).fill(0.3))
    lines = []
    rows = mf.show(a, 0, 1, out=lines.append)
    assert len(rows) == 4 and all(len(r) == 4 for r in rows)
    assert rows[0] == "@   "                        # the first query sees only itself
    assert all(r[i + 1:].strip() == "" for i, r in enumerate(rows))   # future keys: blank
    assert len(lines) == 4 + 3


def test_show_micropython(tmp_path, micropython):
    got = run_family_micropython([{"kind": "show"}], tmp_path, micropython)[0]
    assert got["rows"][0] == "@   " and got["rows"][3][3] == " "      # future and padded keys blank
    assert all(r[i + 1:].strip() == "" for i, r in enumerate(got["rows"]))
    assert len(got["lines"]) == 7 and got["lines"][0].startswith("attention b=0 h=1")
