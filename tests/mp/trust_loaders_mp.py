# Loaders check the whole file, then apply it: a refused checkpoint, adapter, int8 record or
# metadata leaves the model exactly as it was, and the refusal names the file and the field.
# Runs under CPython and MicroPython:
#   MICROPYPATH=lib:board:board/demos:board/benchmarks:tests/mp micropython tests/mp/trust_loaders_mp.py FOLDER OUT.json
# (FOLDER: an empty folder for the files it writes and forges). The model is a small gesture
# classifier (6 features, 4 classes; learned positions, attention), not the Iris demo.
import json
import struct
import sys

import microformer as mf
from microformer import checkpoint, lora, quant
from microformer.spec import from_spec

SPEC = {"type": "Sequential", "layers": [
    {"type": "Dense", "in_features": 6, "out_features": 16},
    {"type": "ActivationLayer", "kind": "gelu"},
    {"type": "Reshape", "shape": [2, 8]},
    {"type": "LearnedPositionalEmbedding", "max_len": 2, "embed_dim": 8},
    {"type": "Attention", "embed_dim": 8, "num_heads": 2},
    {"type": "GlobalAvgPool"},
    {"type": "Dense", "in_features": 8, "out_features": 4}]}
META = {"classes": ["wave", "tap", "shake", "rest"], "features": ["ax", "ay", "az", "gx", "gy", "gz"],
        "mean": [0.0] * 6, "std": [1.0] * 6}


def err(fn, *args):
    try:
        fn(*args)
    except Exception as e:          # the type and message are what the test checks
        return "%s: %s" % (type(e).__name__, e)
    return "no error"


def state(model):
    """Everything a loader could change: each tensor's name, kind, shape and bytes."""
    out = []
    for n, p in model.named_params():
        if quant.is_int8(p):
            out.append((n, "int8", tuple(p.shape), bytes(p.q) + bytes(p.scale)))
        else:
            out.append((n, "f32", tuple(p.shape), bytes(p.data)))
    return out


def model(seed=3):
    mf.seed(seed)
    return from_spec(SPEC)


# ---- a checkpoint file as fields, and back (to forge CRC-valid files) ----------------------

def parse(path):
    with open(path, "rb") as f:
        b = f.read()
    version = struct.unpack("<H", b[4:6])[0]
    p = 16
    t = struct.unpack("<H", b[p:p + 2])[0]
    tag = b[p + 2:p + 2 + t]
    p += 2 + t
    m = struct.unpack("<I", b[p:p + 4])[0]
    meta = json.loads(b[p + 4:p + 4 + m])
    p += 4 + m
    n = struct.unpack("<I", b[p:p + 4])[0]
    p += 4
    recs = []
    for _ in range(n):
        L = struct.unpack("<H", b[p:p + 2])[0]
        name = b[p + 2:p + 2 + L].decode()
        p += 2 + L
        r = b[p]
        shape = struct.unpack("<%dI" % r, b[p + 1:p + 1 + 4 * r])
        p += 1 + 4 * r
        dtype = 0
        if version == 2:
            dtype = b[p]
            p += 1
        size = 1
        for d in shape:
            size *= d
        nb = 4 * size if dtype == 0 else size + 4 * shape[0]
        recs.append([name, list(shape), dtype, bytearray(b[p:p + nb])])
        p += nb
    return version, tag, meta, recs


def build(path, version, tag, meta, recs):
    mb = json.dumps(meta).encode()
    body = bytearray(struct.pack("<H", len(tag)) + tag + struct.pack("<I", len(mb)) + mb
                     + struct.pack("<I", len(recs)))
    for name, shape, dtype, data in recs:
        nb = name.encode()
        body += struct.pack("<H", len(nb)) + nb + struct.pack("<B", len(shape))
        body += struct.pack("<%dI" % len(shape), *shape)
        if version == 2:
            body += bytes((dtype,))
        body += data
    size = 16 + len(body) + 4
    head = b"MFCK" + struct.pack("<HHI", version, 0, size)
    head += struct.pack("<I", checkpoint.crc32(head))
    whole = head + body
    with open(path, "wb") as f:
        f.write(whole)
        f.write(struct.pack("<I", checkpoint.crc32(whole)))


def forge(src, dst, meta_fn=None, recs_fn=None):
    version, tag, meta, recs = parse(src)
    if meta_fn:
        meta_fn(meta)
    if recs_fn:
        version = recs_fn(recs) or version
    build(dst, version, tag, meta, recs)


def record(recs, name):
    for r in recs:
        if r[0] == name:
            return r
    raise KeyError(name)


def put_f32(rec, index, value):
    rec[3][4 * index:4 * index + 4] = struct.pack("<f", value)


# ---- the checks -------------------------------------------------------------------------

def adapters(root, r):
    base = root + "/base.mfck"
    m = model()
    checkpoint.save(base, m, META)
    lora.add_lora(m, 2, 4, ["attention"])
    a = m.named_params()
    for n, p in a:
        if "lora_B" in n:
            for i in range(len(p.data)):
                p.data[i] = 0.01 * (i + 1)
    good = root + "/good.adapter.mfck"
    checkpoint.save_adapter(good, m, base)

    def refused(key, path):
        # a fresh model loaded from the base: the refusal must leave it exactly as it was
        fresh = model(5)
        checkpoint.load(base, fresh)
        before = state(fresh)
        r[key] = err(checkpoint.load_adapter, path, fresh, base)
        r[key + "_same"] = state(fresh) == before
        r[key + "_tensors"] = len(fresh.named_params())

    # 1. a rank of 100000 in the adapter's metadata (tensors of rank 2)
    def rank(meta):
        meta["lora"][0]["rank"] = 100000
    forge(good, root + "/rank.adapter.mfck", rank)
    refused("rank", root + "/rank.adapter.mfck")
    # 2. a tensor the model lacks
    def extra(recs):
        recs.append(["9.lora_A", [2, 8], 0, bytearray(64)])
    forge(good, root + "/extra.adapter.mfck", None, extra)
    refused("extra", root + "/extra.adapter.mfck")
    # a target the model lacks
    def target(meta):
        meta["lora"][0]["targets"].append("7.q_proj")
    forge(good, root + "/target.adapter.mfck", target)
    refused("target", root + "/target.adapter.mfck")
    # 6. NaN inside an adapter tensor
    def nan(recs):
        put_f32(record(recs, "4.v_proj.lora_B"), 3, float("nan"))
    forge(good, root + "/nan.adapter.mfck", None, nan)
    refused("nan", root + "/nan.adapter.mfck")
    r["read_nan"] = err(checkpoint.read, root + "/nan.adapter.mfck")      # what host tools read
    # a value beyond float32 cannot be in a float32 record: inf is what the bits say
    def inf(recs):
        put_f32(record(recs, "4.q_proj.lora_A"), 0, float("-inf"))
    forge(good, root + "/inf.adapter.mfck", None, inf)
    refused("inf", root + "/inf.adapter.mfck")
    # the good one still loads, and gives 8 adapter tensors
    fresh = model(5)
    checkpoint.load_adapter(good, fresh, base)
    r["good_tensors"] = len(fresh.named_params())


def int8_records(root, r):
    m = model()
    m.layers[0].trainable = False
    m.layers[4].trainable = False
    quant.int8(m, ["0.weight", "4.in_proj_weight"], show=False)
    path = root + "/q8.mfck"
    checkpoint.save(path, m, META)

    def refused(key, p):
        fresh = model(5)
        fresh.layers[0].trainable = False
        fresh.layers[4].trainable = False
        before = state(fresh)
        r[key] = err(checkpoint.load, p, fresh)
        r[key + "_same"] = state(fresh) == before
        r[key + "_int8"] = quant.is_int8(fresh)

    # 3. an int8 record on the learned-position table beside legal int8 weights
    def pos(recs):
        rec = record(recs, "3.W")
        rows = rec[1][0]
        rec[2] = 1
        rec[3] = bytearray(rows * rec[1][1]) + bytearray(struct.pack("<f", 0.5) * rows)
    forge(path, root + "/q8pos.mfck", None, pos)
    refused("int8_pos", root + "/q8pos.mfck")
    # 7. an int8 scale of NaN, +inf, -inf
    for key, v in (("scale_nan", float("nan")), ("scale_inf", float("inf")), ("scale_ninf", float("-inf"))):
        def bad(recs, v=v):
            rec = record(recs, "4.Wv")
            rows, cols = rec[1]
            rec[3][rows * cols + 4:rows * cols + 8] = struct.pack("<f", v)
        forge(path, root + "/q8%s.mfck" % key, None, bad)
        refused(key, root + "/q8%s.mfck" % key)
    # a NaN in a float32 weight of a plain checkpoint
    plain = root + "/plain.mfck"
    checkpoint.save(plain, model(), META)

    def wnan(recs):
        put_f32(record(recs, "6.W"), 5, float("nan"))
    forge(plain, root + "/wnan.mfck", None, wnan)
    fresh = model(5)
    before = state(fresh)
    r["weight_nan"] = err(checkpoint.load, root + "/wnan.mfck", fresh)
    r["weight_nan_same"] = state(fresh) == before


def state_dict(r):
    # load_state_dict into a model holding an int8 weight: refused before any tensor is written
    m = model()
    m.layers[6].trainable = False
    quant.int8(m, ["6.weight"], show=False)
    sd = {}
    for k, v in m.state_dict().items():
        sd[k] = v.tolist() if hasattr(v, "tolist") else v
    sd["0.bias"] = [9.0] * 16
    before = state(m)
    r["state_dict_int8"] = err(m.load_state_dict, sd)
    r["state_dict_int8_same"] = state(m) == before


def merge(root, r):
    # merge: an adapter whose product overflows float32 is refused before any weight changes
    m = model()
    lora.add_lora(m, 2, 4, ["attention"])
    for n, p in m.named_params():
        if n == "4.v_proj.lora_B" or n == "4.v_proj.lora_A":
            for i in range(len(p.data)):
                p.data[i] = 3e38
        elif "lora_B" in n:
            for i in range(len(p.data)):
                p.data[i] = 0.5
    before = state(m)
    r["merge_inf"] = err(lora.merge_lora, m)
    r["merge_inf_same"] = state(m) == before
    r["merge_inf_adapters"] = len(lora.adapters(m))


def metadata(r):
    from microformer import meta as mfmeta

    def check(**kw):
        d = dict(META)
        d.update(kw)
        return err(mfmeta.check, d, "checkpoint 'g.mfck'")
    # 8. beyond float32, and a std that is 0 in float32
    r["meta_std_big"] = check(std=[1.0] * 5 + [1e39])
    r["meta_mean_big"] = check(mean=[-1e39] + [0.0] * 5)
    r["meta_std_tiny"] = check(std=[1e-46] + [1.0] * 5)
    r["meta_std_ok"] = check(std=[1e-30] + [1.0] * 5)
    # 9. names a CSV cannot hold
    r["meta_class_comma"] = check(classes=["wave", "tap,double", "shake", "rest"])
    r["meta_class_newline"] = check(classes=["wave", "tap\nx", "shake", "rest"])
    r["meta_class_space"] = check(classes=["wave", " tap", "shake", "rest"])
    r["meta_class_trail"] = check(classes=["wave", "tap ", "shake", "rest"])
    r["meta_class_quote"] = check(classes=["wave", 'tap"', "shake", "rest"])
    r["meta_feature_comma"] = check(features=["ax", "ay", "a,z", "gx", "gy", "gz"])
    r["meta_target_comma"] = check(task="regress", targets=["speed,kmh"])
    r["meta_names_ok"] = check(classes=["wave", "tap twice", "shake-it", "r\u00e9st"])


def losses(r):
    # 15. a loss beyond float32 (3e38 vs -3e38: 3.6e77 in a double) is refused, as the board's
    # float32 arithmetic gives inf there
    from array import array

    from microformer.tensor import Tensor as T

    def Tensor(shape, values):
        return T(shape, array("f", values))
    for key, loss in (("mse_overflow", mf.MSELoss()), ("ce_ok", mf.CrossEntropyLoss())):
        if key == "mse_overflow":
            r[key] = err(loss.forward, Tensor((1, 2), [3e38, 3e38]), Tensor((1, 2), [-3e38, -3e38]))
        else:
            r[key] = err(loss.forward, Tensor((1, 2), [1.0, -1.0]), [0])
    r["mse_big_ok"] = err(mf.MSELoss().forward, Tensor((1, 2), [1e18, 0.0]), Tensor((1, 2), [-1e18, 0.0]))


def run(root):
    r = {}
    losses(r)
    adapters(root, r)
    int8_records(root, r)
    merge(root, r)
    state_dict(r)
    metadata(r)
    return r


if __name__ == "__main__":
    out = run(sys.argv[1])
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)
    print("TRUST LOADERS DONE")
