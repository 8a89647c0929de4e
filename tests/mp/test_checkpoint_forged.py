"""Forged checkpoints (CRC-valid, with any tag, metadata and tensor table) are refused with a
CheckpointError naming the file and what is wrong, before any layer is built, in milliseconds:
on CPython and on both MicroPython ports. The sizes a spec declares are read off its arguments
(microformer.specplan.plan): a test compares them with the layers themselves, for every layer type."""
import json
import time

import pytest

import helpers
import microformer as mf
from microformer import checkpoint as ck
from microformer import spec as mspec
from microformer import specformat, specplan
import checkpoint_forged_mp as forged

NOT_A_FILE = {"directory": ("IsADirectoryError", "OSError"), "missing": ("FileNotFoundError", "OSError")}


def _judge(results, bound_ms):
    seen = set()
    for r in results:
        seen.add(r["case"])
        where = (r["case"], r["call"], r["exc"], r["msg"])
        if r["case"] in NOT_A_FILE:
            assert r["exc"] in NOT_A_FILE[r["case"]], where
        else:
            assert r["exc"] == "CheckpointError", where
        assert r["path"] in r["msg"], where             # the file is named
        assert r["want"] in r["msg"], where             # and what is wrong with it
        assert r["ms"] < bound_ms, where
    assert seen == {c[0] for c in forged.CASES} | set(NOT_A_FILE), seen
    return len(results)


def test_forged_files_cpython(tmp_path):
    out = []
    t0 = time.time()
    forged.run(str(tmp_path), out.append)
    n = _judge(out, 2000)
    assert time.time() - t0 < 10, "%d refusals took %.1f s" % (n, time.time() - t0)
    sizes = {r["case"]: r["size"] for r in out}
    assert sizes["dense_8192"] < 300 and sizes["transformer_1e6_layers"] < 400, sizes


def test_forged_files_micropython(tmp_path, micropython):
    out = helpers.run_micropython(helpers.script("checkpoint_forged_mp.py"), str(tmp_path), exe=micropython,
                                  heap="2M")
    _judge([json.loads(l) for l in out.splitlines()], 2000)


def test_plan_refuses_absurd_sizes_without_building():
    """specplan.plan: a ValueError naming the limit in milliseconds, not a MemoryError after a minute."""
    for spec in ({"type": "Dense", "in_features": 8192, "out_features": 8192},
                 dict(forged.TF), {"type": "Sequential", "layers": [{"type": "Embedding", "vocab": 2 ** 40,
                                                                     "embed_dim": 2}]}):
        t0 = time.time()
        with pytest.raises(ValueError, match="MAX_PARAMS"):
            specplan.plan(spec)
        assert time.time() - t0 < 2


def test_the_limit_is_where_the_documentation_says():
    n = specformat.MAX_PARAMS
    # a spec right at the limit plans; one float more is refused
    assert specplan.plan({"type": "Embedding", "vocab": n // 4, "embed_dim": 4}) == (n, 0)
    with pytest.raises(ValueError, match="MAX_PARAMS = %d" % n):
        specplan.plan({"type": "Sequential", "layers": [{"type": "Embedding", "vocab": n // 4, "embed_dim": 4},
                                                     {"type": "LayerNorm", "dim": 1}]})
    with pytest.raises(ValueError, match="MAX_PARAMS"):
        specplan.plan({"type": "PositionalEncoding", "max_len": n // 4 + 1, "embed_dim": 4})


# ---- the planned sizes are the layers' own --------------------------------------------------

SPECS = [
    {"type": "Dense", "in_features": 3, "out_features": 5},
    {"type": "Dense", "in_features": 3, "out_features": 5, "use_bias": False},
    {"type": "Attention", "embed_dim": 6, "num_heads": 2},
    {"type": "Attention", "embed_dim": 4, "num_heads": 1, "use_bias": False, "causal": True, "max_len": 7},
    {"type": "ActivationLayer", "kind": "tanh"},
    {"type": "Reshape", "shape": [2, 3]},
    {"type": "GlobalAvgPool"},
    {"type": "LayerNorm", "dim": 5},
    {"type": "FeedForward", "embed_dim": 4, "hidden": 6},
    {"type": "FeedForward", "embed_dim": 4, "hidden": 6, "activation": "relu", "use_bias": False},
    {"type": "Embedding", "vocab": 9, "embed_dim": 3},
    {"type": "PositionalEncoding", "max_len": 11, "embed_dim": 4},
    {"type": "EncoderBlock", "embed_dim": 4, "num_heads": 2, "ffn_hidden": 6},
    {"type": "EncoderBlock", "embed_dim": 4, "num_heads": 2, "ffn_hidden": 6, "use_bias": False, "causal": True},
    {"type": "Dropout", "p": 0.25},
    {"type": "DecoderBlock", "embed_dim": 4, "num_heads": 2, "ffn_hidden": 5},
    {"type": "DecoderBlock", "embed_dim": 4, "num_heads": 1, "ffn_hidden": 5, "use_bias": False},
    {"type": "Transformer", "src_vocab": 7, "tgt_vocab": 5, "embed_dim": 4, "num_heads": 2, "ffn_hidden": 6},
    {"type": "Transformer", "src_vocab": 7, "tgt_vocab": 5, "embed_dim": 4, "num_heads": 2, "ffn_hidden": 6,
     "num_encoder_layers": 3, "num_decoder_layers": 2, "max_len": 9, "use_bias": False},
    {"type": "Conv1D", "in_channels": 4, "out_channels": 6, "kernel_size": 3},
    {"type": "Conv1D", "in_channels": 4, "out_channels": 6, "kernel_size": 3, "groups": 2, "use_bias": False},
    {"type": "MaxPool1D", "kernel_size": 2},
    {"type": "AvgPool1D", "kernel_size": 3, "stride": 1, "padding": 1},
    {"type": "LearnedPositionalEmbedding", "max_len": 6, "embed_dim": 4},
    {"type": "SelectPosition", "index": -1},
    {"type": "PrependToken", "embed_dim": 4},
    {"type": "SeqReduce", "kind": "max"},
    {"type": "PositionTable", "max_len": 6, "embed_dim": 4},
]
# graph.py's containers: a NamedSequential (names are whole paths, a PrependToken's its parameter's
# name) with a Residual around a NamedSequential
NAMED = {"type": "NamedSequential", "names": ["stem.", "cls", "", "head."], "layers": [
    SPECS[0], {"type": "PrependToken", "embed_dim": 5},
    {"type": "Residual", "inner": {"type": "NamedSequential", "names": ["blk.norm.", "blk.ff."],
                                   "layers": [{"type": "LayerNorm", "dim": 5}, {"type": "FeedForward", "embed_dim": 5,
                                                                                 "hidden": 6}]}},
    {"type": "Dense", "in_features": 5, "out_features": 2}]}


def _tables(model):
    # the floats of fixed (non-parameter) tables the model holds: PositionalEncoding's pe
    n = 0
    todo = [model]
    while todo:
        l = todo.pop()
        if type(l).__name__ == "PositionalEncoding":
            n += len(l.pe.data)
        todo.extend(getattr(l, "layers", None) or (l.sublayers() if hasattr(l, "sublayers") else ()))
    return n


@pytest.mark.parametrize("spec", SPECS + [NAMED, {"type": "Sequential", "layers": SPECS},
                                          {"type": "Sequential", "layers": [SPECS[0], {"type": "Sequential",
                                                                                       "layers": [SPECS[7]]}]}],
                         ids=[s["type"] + str(i) for i, s in enumerate(SPECS)] + ["NamedSequential", "Sequential",
                                                                                  "nested"])
def test_planned_sizes_are_the_layers_own(spec):
    model = mf.from_spec(spec)
    real = [(n, tuple(p.shape)) for n, p in ck._named(model)]
    assert specplan.named_shapes(spec) == real
    params, tables = specplan.plan(spec)
    assert params == sum(len(p.data) for _, p in ck._named(model))
    assert tables == _tables(model)
    # the spec the model writes (every argument spelled out) plans the same
    assert specplan.named_shapes(mf.to_spec(model)) == real


def test_every_layer_type_is_planned():
    assert {s["type"] for s in SPECS} == set(mspec._LAYERS) == set(specplan._P)


def test_a_saved_model_passes_its_own_check(tmp_path):
    model = mf.from_spec({"type": "Sequential", "layers": [SPECS[2], SPECS[8], SPECS[3]]})
    path = str(tmp_path / "m.mfck")
    ck.save(path, model, {"v": 1})
    again = mf.load_model(path)
    assert [bytes(p.data) for _, p in ck._named(again)] == [bytes(p.data) for _, p in ck._named(model)]
