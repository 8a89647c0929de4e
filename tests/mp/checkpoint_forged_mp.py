# Forged, CRC-valid checkpoints that the loader must refuse with a CheckpointError naming the
# file and what is wrong, in milliseconds, before any layer is built. Runs in CPython and in
# MicroPython (test_checkpoint_forged.py runs both):
#   MICROPYPATH=lib:tests/mp micropython tests/mp/checkpoint_forged_mp.py DIR
# prints one JSON line per case: {"case", "call", "exc", "msg", "ms", "size"}.
import json
import os
import sys
import time

import microformer as mf
from microformer import checkpoint as ck
from checkpoint_craft_mp import craft

FMT = "microformer-spec/1"


def seq(*layers):
    return {"type": "Sequential", "layers": list(layers), "format": FMT}


def dense(i, o, **kw):
    d = {"type": "Dense", "in_features": i, "out_features": o}
    d.update(kw)
    return d


def nested(depth):
    s = seq(dense(2, 2))
    for _ in range(depth):
        s = {"type": "Sequential", "layers": [s]}
    return s


W22 = [("0.W", (2, 2), None), ("0.b", (2,), None)]
TAG = "Sequential(Dense)"
TF = {"type": "Transformer", "src_vocab": 4, "tgt_vocab": 4, "embed_dim": 4, "num_heads": 1,
      "ffn_hidden": 4, "num_encoder_layers": 10 ** 6, "format": FMT}
PARSE = ("load_model", "read_header", "load")      # refused by every reader

# (case, tag, meta (object or raw bytes), tensors, calls, what the message must say)
CASES = [
    ("dense_8192", TAG, {"spec": seq(dense(8192, 8192))}, [("0.W", (2, 2), None)], ("load_model",), "MAX_PARAMS"),
    ("transformer_1e6_layers", "Transformer", {"spec": TF}, [], ("load_model",), "MAX_PARAMS"),
    ("posenc_max_len_1e9", TAG, {"spec": seq({"type": "PositionalEncoding", "max_len": 10 ** 9, "embed_dim": 8})},
     [], ("load_model",), "max_len = 1000000000 is more than the limit MAX_PARAMS"),
    ("embedding_80M", TAG, {"spec": seq({"type": "Embedding", "vocab": 10 ** 7, "embed_dim": 8})},
     [("0.W", (1, 8), None)], ("load_model",), "MAX_PARAMS"),
    ("legacy_layers_8192", TAG, {"layers": [["Dense", 8192, 8192]]}, [], ("load_model",), "MAX_PARAMS"),
    ("fewer_floats_than_spec", TAG, {"spec": seq(dense(4, 3))}, [("0.W", (3, 4), None)], ("load_model",),
     "the spec declares 15 parameters (60 bytes), the file's tensors hold 12 (48 bytes)"),
    ("shape_differs", TAG, {"spec": seq(dense(4, 3))}, [("0.W", (3, 5), None)], ("load_model",),
     "the spec declares tensor '0.W' (3, 4), the file holds (3, 5)"),
    ("name_differs", TAG, {"spec": seq(dense(4, 3))}, [("0.X", (3, 4), None), ("0.b", (3,), None)],
     ("load_model",), "the spec declares tensor '0.W' (3, 4), the file has no tensor of that name"),
    ("extra_tensor", TAG, {"spec": seq(dense(4, 3, use_bias=False))}, [("0.W", (3, 4), None), ("9.Z", (0,), None)],
     ("load_model",), "the file holds tensor '9.Z' (0,), which the spec does not declare"),
    ("meta_list", TAG, b"[1, 2]", W22, PARSE, "metadata: must be a JSON object, got list"),
    ("meta_null", TAG, b"null", W22, PARSE, "metadata: must be a JSON object, got null"),
    ("meta_string", TAG, b'"spec"', W22, PARSE, "metadata: must be a JSON object, got str"),
    ("meta_not_json", TAG, b"{'a': 1}", W22, PARSE, "metadata (not JSON)"),
    ("tag_not_utf8", b"\xff\xfeSeq", {}, W22, PARSE, "the model tag is not UTF-8"),
    ("meta_not_utf8", TAG, b'{"a": "\xff"}', W22, PARSE, "the metadata is not UTF-8"),
    ("name_not_utf8", TAG, {}, [(b"0.\xc3", (2, 2), None)], PARSE, "the name of tensor 0 is not UTF-8"),
    ("meta_deep_object", TAG, b'{"a":' * 100 + b"1" + b"}" * 100, W22, PARSE, "nested more than 32 levels"),
    ("meta_deep_20000", TAG, b'{"a":' + b"[" * 20000 + b"]" * 20000 + b"}", W22, PARSE, "32 levels"),
    ("sequential_nested_9", TAG, {"spec": nested(9)}, [], ("load_model",), "nested more than MAX_DEPTH = 8 deep"),
    ("sequential_nested_400", TAG,
     b'{"spec":' + b'{"type":"Sequential","layers":[' * 400 + b'{"type":"Dense","in_features":2,"out_features":2}'
     + b"]}" * 400 + b"}", W22, ("load_model",), "nested"),
    ("unknown_argument", TAG, {"spec": seq(dense(2, 2, foo=1))}, W22, ("load_model",), "'foo'"),
    ("rng_argument", TAG, {"spec": seq(dense(2, 2, rng=5))}, W22, ("load_model",), "'rng' is not a spec argument"),
    ("str_size", TAG, {"spec": seq(dense("2", 2))}, W22, ("load_model",), "in_features must be an int >= 1, got '2'"),
    ("bool_size", TAG, {"spec": seq(dense(True, 2))}, W22, ("load_model",), "in_features must be an int >= 1, got True"),
    ("float_size", TAG, {"spec": seq(dense(2.0, 2))}, W22, ("load_model",), "in_features must be an int >= 1, got 2.0"),
    ("negative_size", TAG, {"spec": seq(dense(-2, 2))}, W22, ("load_model",), "in_features must be an int >= 1, got -2"),
    ("use_bias_str", TAG, {"spec": seq(dense(2, 2, use_bias="yes"))}, W22, ("load_model",),
     "use_bias must be true or false, got 'yes'"),
    ("missing_argument", TAG, {"spec": seq({"type": "Dense", "in_features": 2})}, W22, ("load_model",),
     "missing argument 'out_features'"),
    ("unknown_type", TAG, {"spec": seq({"type": "Conv9"})}, [], ("load_model",), "unknown layer type 'Conv9'"),
    ("spec_not_a_dict", TAG, {"spec": 5}, W22, ("load_model",), "must be a dict with a 'type', got 5"),
    ("layers_not_a_list", TAG, {"spec": {"type": "Sequential", "layers": 3}}, W22, ("load_model",),
     "needs a 'layers' list, got 3"),
    ("wrong_format", TAG, {"spec": dict(seq(dense(2, 2)), format="other/9")}, W22, ("load_model",), "format 'other/9'"),
    ("heads_do_not_divide", TAG, {"spec": seq({"type": "Attention", "embed_dim": 2, "num_heads": 3,
                                               "use_bias": False})},
     [("0.Wq", (2, 2), None), ("0.Wk", (2, 2), None), ("0.Wv", (2, 2), None), ("0.Wo", (2, 2), None)],
     ("load_model",), "divisible by num_heads"),
    ("bad_activation", TAG, {"spec": seq({"type": "ActivationLayer", "kind": "nope"})}, [], ("load_model",),
     "kind must be one of"),
    ("legacy_unknown_layer", TAG, {"layers": [["Nope", 1]]}, [], ("load_model",), "meta['layers'][0]"),
    ("legacy_too_many_args", TAG, {"layers": [["GlobalAvgPool", 1]]}, [], ("load_model",),
     "GlobalAvgPool takes at most 0 arguments, got 1"),
]


def attempt(fn):
    t0 = time.ticks_ms() if hasattr(time, "ticks_ms") else None
    t1 = time.time()
    try:
        fn()
        exc, msg = None, None
    except Exception as e:
        exc, msg = type(e).__name__, str(e)
    ms = time.ticks_diff(time.ticks_ms(), t0) if t0 is not None else int(1000 * (time.time() - t1))
    return exc, msg, ms


def small():
    mf.seed(1)
    return mf.Sequential([mf.Dense(2, 2)])


def run(d, report):
    for case, tag, meta, tensors, calls, want in CASES:
        path = d + "/" + case + ".mfck"
        data = craft(tag, meta, tensors)
        with open(path, "wb") as f:
            f.write(data)
        for call in calls:
            if call == "load_model":
                fn = lambda: mf.load_model(path)
            elif call == "read_header":
                fn = lambda: ck.read_header(path)
            else:
                fn = lambda: ck.load(path, small())
            exc, msg, ms = attempt(fn)
            report({"case": case, "call": call, "exc": exc, "msg": msg, "ms": ms, "size": len(data),
                    "want": want, "path": path})
    # not a file: a directory, a missing path
    os.mkdir(d + "/adir.mfck")
    for case, path in (("directory", d + "/adir.mfck"), ("missing", d + "/nope.mfck")):
        exc, msg, ms = attempt(lambda: mf.load_model(path))
        report({"case": case, "call": "load_model", "exc": exc, "msg": msg, "ms": ms, "size": 0,
                "want": path, "path": path})


if __name__ == "__main__":
    run(sys.argv[1], lambda r: print(json.dumps(r)))
