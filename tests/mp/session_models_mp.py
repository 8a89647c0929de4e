# finetune.Session on models other than Iris, under CPython and inside MicroPython, directly
#   MICROPYPATH=lib:board:board/demos:board/benchmarks:tests/mp micropython tests/mp/session_models_mp.py FLASH
# FLASH: an empty folder; the script writes each model's checkpoint and data there itself. Prints
# SESSION MODELS OK or raises AssertionError (tests/mp/test_session_models.py runs it everywhere).
#   window  Dense(C,E) -> LearnedPositionalEmbedding -> EncoderBlock -> GlobalAvgPool -> Dense: a
#           TransformerEncoderLayer-style classifier over [L, C] windows, fed [B, L, C]
#   sensor  board/demos/sensor.py's model (Reshape, Conv1D, ReLU, MaxPool1D, LearnedPositionalEmbedding,
#           EncoderBlock, GlobalAvgPool, Dense) on 100 x 6 windows
#   regress a window [4, 2] taken flat by Dense(8, 16): two targets, MSE
import gc
import os
import sys

import microformer as mf
from microformer.tensor import Rng, Tensor

import finetune
import sensor

MICRO = sys.implementation.name == "micropython"
L, C, E = 6, 3, 8
CLASSES = ["low", "mid", "high"]


def mkdir(p):
    try:
        os.mkdir(p)
    except OSError:
        pass


def write_csv(path, header, rows):
    with open(path, "w") as f:
        f.write(",".join(header) + "\n")
        for r in rows:
            f.write(",".join(str(v) for v in r) + "\n")


def err(fn, *args, **kw):
    try:
        fn(*args, **kw)
    except (ValueError, OSError) as e:
        return "%s: %s" % (type(e).__name__, e.args[-1] if isinstance(e, OSError) else e)
    return "no error"


def snap(model):
    return dict((k, bytes(t.data)) for k, t in model.state_dict().items())


def window_rows(n, seed):
    # class k: channel j of every reading about 10 * j + 5 * k (raw units far from 0 / 1, so the
    # per-channel standardization matters), label last
    rng = Rng(seed)
    rows = []
    for i in range(n):
        k = i % 3
        row = []
        for t in range(L):
            for j in range(C):
                row.append(round(10 * j + 5 * k + rng.uniform(-1.0, 1.0), 3))
        rows.append(row + [CLASSES[k]])
    return rows


def window_model():
    mf.seed(3)
    return mf.Sequential([mf.Dense(C, E), mf.LearnedPositionalEmbedding(L, E),
                          mf.EncoderBlock(E, 2, 2 * E, activation="relu"), mf.GlobalAvgPool(),
                          mf.Dense(E, len(CLASSES))])


def window_meta():
    return {"task": "classify", "classes": CLASSES, "input_shape": [L, C], "features": ["a", "b", "c"],
            "mean": [10.0, 20.0, 30.0], "std": [4.0, 4.0, 4.0], "data": "win.csv", "split_seed": 1,
            "n_train": 18}


def softmax(v):
    from math import exp
    m = max(v)
    e = [exp(x - m) for x in v]
    s = sum(e)
    return [x / s for x in e]


def check_window(root):
    r = {}
    model = window_model()
    meta = window_meta()
    mf.save_checkpoint(root + "/model.mfck", model, meta)
    write_csv(root + "/data/win.csv", ["t%d_%s" % (t, c) for t in range(L) for c in "abc"] + ["label"],
              window_rows(24, 5))
    s = finetune.Session(root=root, verbose=False, batch_size=8)
    assert s.num_features == L * C and s.input_shape == [L, C]
    assert s._shape == (L, C), s._shape             # Dense(C, E) first: the model takes [B, L, C]
    ev = s.evaluate()
    assert ev["n"] == 6 and s.evaluate("train")["n"] == 18, ev
    # one window: L readings of C numbers, or L*C numbers time-major; standardized per channel
    reading = [[1.0 + t, 22.0, 29.5 - t] for t in range(L)]
    flat = []
    for x in reading:
        flat.extend(x)
    p1 = s.predict(reading)
    p2 = s.predict(flat)
    assert p1.probs == p2.probs, (p1.probs, p2.probs)
    X = Tensor((1, L, C))
    for i in range(L * C):
        X.data[i] = (flat[i] - meta["mean"][i % C]) / meta["std"][i % C]
    want = softmax(list(model.forward(X).data))
    # the data sets fit and evaluate use are standardized the same way
    ds = s._select([(reading, "low"), (flat, 2)], "test")[1]
    assert list(ds.X.data) == list(X.data) * 2 and ds.y == [0, 2], (list(ds.X.data)[:6], ds.y)
    assert max(abs(want[k] - p1.probs[k]) for k in range(3)) < 1e-6, (want, p1.probs)
    r["bad_window"] = err(s.predict, reading[:-1])
    r["bad_reading"] = err(s.predict, reading[:-1] + [[1.0, 2.0]])
    r["bad_flat"] = err(s.predict, flat[:-1])

    # parts: the model's state_dict names and kinds
    names = list(model.state_dict().keys())
    assert [p[0] for p in s.parts(False)] == names, [p[0] for p in s.parts(False)]
    r["kinds"] = {}
    for kind in ("embedding", "attention", "norm", "ffn", "head", "input", "bias"):
        r["kinds"][kind] = s.freeze(kind)
        s.unfreeze()
    r["names"] = names
    r["glob"] = s.freeze("2.*")
    s.unfreeze()
    r["prefix"] = s.freeze("2.self_attn", "2.linear1")
    s.unfreeze()
    r["index"] = s.freeze(-1)
    s.unfreeze()
    r["again"] = s.freeze("head") + s.freeze("head")       # already frozen: nothing changes
    s.unfreeze()
    r["bad_part"] = err(s.freeze, "decoder")
    r["bad_index"] = err(s.freeze, 3)                      # GlobalAvgPool holds no parameters
    r["empty_kind"] = err(s.freeze, "ffn.x")

    # a partly frozen layer: the head's bias stays, its weight trains; the attention stays
    s.freeze("4.bias", "attention")
    before = snap(s.model)
    s.add_examples([(reading, "high"), (flat, 0)])
    h = s.fit(epochs=2, data="train", verbose=False)
    after = snap(s.model)
    frozen = ["4.bias"] + [k for k in names if "self_attn" in k]
    r["fit_steps"] = h["steps"]
    r["frozen_same"] = [k for k in frozen if before[k] != after[k]]
    r["others_moved"] = [k for k in names if k not in frozen and before[k] == after[k]]
    r["fit_frozen"] = s.meta["history"][-1]["frozen"]
    s.save()
    p_saved = s.predict(reading, False).probs
    del s
    gc.collect()
    t = finetune.Session(root=root, verbose=False, batch_size=8)
    r["reload_same"] = t.predict(reading, False).probs == p_saved and t.num_examples() == 2
    r["user_header"] = open(root + "/data/user.csv").readline().strip()
    return r


def check_sensor(root):
    r = {}
    model = sensor.build_model(1, 8)
    rows = []
    rng = Rng(2)
    for i in range(8):
        k = i % 4
        rows.append([round(k + rng.uniform(-0.5, 0.5), 3) for _ in range(600)] + [sensor.CLASSES[k]])
    write_csv(root + "/data/motion.csv", ["v%d" % i for i in range(600)] + ["label"], rows)
    meta = {"classes": sensor.CLASSES, "input_shape": [100, 6], "mean": [0.0] * 6, "std": [1.0] * 6,
            "features": ["acc_x", "acc_y", "acc_z", "gyro_x", "gyro_y", "gyro_z"], "data": "motion.csv",
            "n_train": 6}
    mf.save_checkpoint(root + "/sensor.mfck", model, meta)
    s = finetune.Session("sensor.mfck", root=root, verbose=False, batch_size=4)
    r["sensor_names"] = list(model.state_dict().keys())
    r["sensor_kinds"] = {}
    for kind in ("attention", "head", "embedding", "input", "norm", "ffn"):
        r["sensor_kinds"][kind] = s.freeze(kind)
        s.unfreeze()
    s.freeze("attention")
    before = snap(s.model)
    s.fit(epochs=1, data="train", verbose=False)
    after = snap(s.model)
    r["sensor_frozen_same"] = all(before[k] == after[k] for k in before if "self_attn" in k)
    r["sensor_head_moved"] = before["7.weight"] != after["7.weight"]
    r["sensor_eval_n"] = s.evaluate("test", verbose=False)["n"]
    return r


def check_regress(root):
    r = {}
    mf.seed(4)
    model = mf.Sequential([mf.Dense(8, 16), mf.ActivationLayer("tanh"), mf.Dense(16, 2)])
    rng = Rng(6)
    rows = []
    for i in range(40):
        x = [round(rng.uniform(-2.0, 2.0), 3) for _ in range(8)]
        rows.append(x + [round(0.5 * x[0] - x[3] + 0.25 * x[6], 4), round(x[1] * 0.3 + 1.0, 4)])
    write_csv(root + "/data/reg.csv", ["x%d" % i for i in range(8)] + ["u", "v"], rows)
    meta = {"task": "regress", "targets": ["u", "v"], "input_shape": [4, 2], "features": ["p", "q"],
            "mean": [0.0, 0.0], "std": [2.0, 2.0], "data": "reg.csv", "split_seed": 3, "n_train": 32}
    mf.save_checkpoint(root + "/reg.mfck", model, meta)
    s = finetune.Session("reg.mfck", root=root, verbose=False, batch_size=8, lr=0.01)
    assert s._shape == (8,), s._shape              # Dense(8, 16) first: the window goes in flat
    e0 = s.evaluate("test", verbose=False)
    # RMSE / MAE from predict, by hand
    X, Y = s._raw("test")
    sq = [0.0, 0.0]
    ab = [0.0, 0.0]
    for i in range(len(Y)):
        v = s.predict([X[i * 8 + j] for j in range(8)], False).values
        for k in range(2):
            sq[k] += (v[k] - Y[i][k]) ** 2
            ab[k] += abs(v[k] - Y[i][k])
    n = len(Y)
    r["by_hand"] = max(max(abs((sq[k] / n) ** 0.5 - e0["rmse"][k]), abs(ab[k] / n - e0["mae"][k]))
                       for k in range(2))
    r["rmse0"] = e0["rmse"]
    s.fit(epochs=60, data="train", verbose=False)
    r["rmse1"] = s.evaluate("test", verbose=False)["rmse"]
    r["n_test"] = e0["n"]
    r["bad_target"] = err(s.add_example, [0.0] * 8, "high")
    r["bad_targets"] = err(s.add_example, [[0.0, 1.0]] * 4, [1.0])
    s.add_example([[0.5, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 0.0]], [0.125, 1.25])
    s.add_examples([([0.0] * 8, [2.0, -1.5])])
    del s
    gc.collect()
    t = finetune.Session("reg.mfck", root=root, verbose=False)
    r["reg_user"] = t._raw("user")[1]
    r["reg_file"] = open(root + "/data/reg.user.csv").read()          # reg.mfck's own examples
    r["reg_fit_user"] = t.fit(epochs=1, verbose=False)["steps"]
    return r


def check_errors(root):
    r = {}
    model = window_model()
    for name, change in (("std0", {"std": [4.0, 0.0, 4.0]}), ("stdneg", {"std": [4.0, 4.0, -1.0]}),
                         ("meanlen", {"mean": [1.0, 2.0]}), ("dupes", {"classes": ["low", "mid", "low"]}),
                         ("outputs", {"classes": ["low", "high"]}), ("shape", {"input_shape": [L, 4],
                                                                               "mean": [0.0] * 4, "std": [1.0] * 4,
                                                                               "features": ["a", "b", "c", "d"]}),
                         ("nodata", {"data": "missing.csv"})):
        meta = window_meta()
        meta.update(change)
        mf.save_checkpoint(root + "/%s.mfck" % name, model, meta)
        r[name] = err(finetune.Session, name + ".mfck", root=root, verbose=False)
    r["batch_true"] = err(finetune.Session, root=root, batch_size=True)
    r["lr_neg"] = err(finetune.Session, root=root, lr=-1.0)
    r["lr_str"] = err(finetune.Session, root=root, lr="0.1")
    r["ck_int"] = err(finetune.Session, 5, root=root)
    r["missing"] = err(finetune.Session, root=root)       # no model.mfck here, other .mfck files
    return r


def run(root):
    r = {}
    for sub, fn in (("w", check_window), ("s", check_sensor), ("r", check_regress), ("e", check_errors)):
        d = root + "/" + sub
        mkdir(d)
        mkdir(d + "/data")
        r.update(fn(d))
        gc.collect()
    return r


def _expect(got, want):
    assert got == want, "got %r\nwant %r" % (got, want)


def check(r):
    names = r["names"]
    k = r["kinds"]
    _expect(k["attention"], [n for n in names if n.startswith("2.self_attn.")])
    _expect(k["head"], ["4.weight", "4.bias"])
    _expect(k["embedding"], ["1.weight"])
    _expect(k["norm"], [n for n in names if n.startswith("2.norm")])
    _expect(k["ffn"], [n for n in names if n.startswith("2.linear")])
    _expect(k["input"], ["0.weight", "0.bias", "1.weight"])
    _expect(k["bias"], [n for n in names if n.endswith("bias") or ".norm" in n])
    _expect(r["glob"], [n for n in names if n.startswith("2.")])
    _expect(r["prefix"], [n for n in names if n.startswith("2.self_attn.") or n.startswith("2.linear1.")])
    _expect(r["index"], ["4.weight", "4.bias"])
    _expect(r["again"], ["4.weight", "4.bias"])
    assert r["bad_part"].startswith("ValueError: freeze: unknown part 'decoder'; valid: kinds 'embedding', "
                                    "'attention', 'norm', 'ffn', 'head', 'input', 'bias', 'all'; a layer "
                                    "index 0..4; a name, a prefix or a glob of " + ", ".join(names)), r["bad_part"]
    _expect(r["bad_index"], "ValueError: freeze: layer 3 (GlobalAvgPool) has no parameters; layers with "
                            "parameters: 0 Dense, 1 LearnedPositionalEmbedding, 2 EncoderBlock, 4 Dense")
    assert r["empty_kind"].startswith("ValueError: freeze: unknown part 'ffn.x'; valid:"), r["empty_kind"]
    _expect(r["bad_window"], "ValueError: predict: expected a window of %d readings of %d numbers (a, b, c), "
                             "got %d readings" % (L, C, L - 1))
    _expect(r["bad_reading"], "ValueError: predict: reading %d must be %d numbers (a, b, c), got [1.0, 2.0]"
            % (L - 1, C))
    _expect(r["bad_flat"], "ValueError: predict: expected a window of %d readings x %d channels (a, b, c): "
                           "%d numbers time-major or a list of %d readings, got %d numbers"
            % (L, C, L * C, L, L * C - 1))
    assert r["fit_steps"] == 2 * 3, r["fit_steps"]              # 18 train rows, batch 8
    _expect(r["frozen_same"], [])
    _expect(r["others_moved"], [])
    _expect(r["fit_frozen"], [n for n in names if "self_attn" in n] + ["4.bias"])
    assert r["reload_same"]
    _expect(r["user_header"], ",".join("t%d_%s" % (t, c) for t in range(L) for c in "abc") + ",label")

    sn = r["sensor_names"]
    sk = r["sensor_kinds"]
    _expect(sk["attention"], ["5.self_attn.in_proj_weight", "5.self_attn.in_proj_bias",
                              "5.self_attn.out_proj.weight", "5.self_attn.out_proj.bias"])
    _expect(sk["head"], ["7.weight", "7.bias"])
    _expect(sk["embedding"], ["4.weight"])
    _expect(sk["input"], ["1.weight", "1.bias", "4.weight"])
    _expect(sk["norm"], [n for n in sn if n.startswith("5.norm")])
    _expect(sk["ffn"], [n for n in sn if n.startswith("5.linear")])
    assert r["sensor_frozen_same"] and r["sensor_head_moved"]
    assert r["sensor_eval_n"] == 2

    assert r["by_hand"] < 1e-5, r["by_hand"]
    assert r["n_test"] == 8
    assert r["rmse1"][0] < 0.5 * r["rmse0"][0] and r["rmse1"][1] < 0.5 * r["rmse0"][1], (r["rmse0"], r["rmse1"])
    _expect(r["bad_target"], "ValueError: add_example: the target must be 2 numbers (u, v), got 'high'")
    _expect(r["bad_targets"], "ValueError: add_example: the target must be 2 numbers (u, v), got [1.0]")
    _expect(r["reg_user"], [(0.125, 1.25), (2.0, -1.5)])
    # the header names every target (the last field is the last target, v)
    _expect(r["reg_file"], "t0_p,t0_q,t1_p,t1_q,t2_p,t2_q,t3_p,t3_q,u,v\n"
                           "0.5,1,0,0,1,0,0,0,0.125,1.25\n0,0,0,0,0,0,0,0,2,-1.5\n")
    assert r["reg_fit_user"] == 1

    ck = "checkpoint '%s/e/%%s.mfck'" % ROOT
    _expect(r["std0"], "MetaError: %s: metadata 'std' must be a list of numbers > 0 (a std of 0.0 would divide "
                       "by zero), got [4.0, 0.0, 4.0]" % (ck % "std0"))
    _expect(r["stdneg"], "MetaError: %s: metadata 'std' must be a list of numbers > 0 (a std of -1.0 would "
                         "flip the feature's sign), got [4.0, 4.0, -1.0]" % (ck % "stdneg"))
    _expect(r["meanlen"], "MetaError: %s: metadata 'mean' must be a list of 3 numbers (one per "
                          "feature/channel), got [1.0, 2.0]" % (ck % "meanlen"))
    _expect(r["dupes"], "MetaError: %s: metadata 'classes' must be a list of unique names ('low' repeats), "
                        "got ['low', 'mid', 'low']" % (ck % "dupes"))
    _expect(r["outputs"], "ValueError: Session: %s: the model gives [1, 3] per example, but its metadata names "
                          "2 classes (low, high): expected [1, 2]" % (ck % "outputs"))
    assert r["shape"].startswith("ValueError: Session: %s: the model does not take the metadata's input_shape "
                                 "[%d, 4] ([B, %d, 4]: " % (ck % "shape", L, L)), r["shape"]
    assert r["shape"].find("; [B, %d]: " % (4 * L)) > 0, r["shape"]
    assert r["nodata"] == "no error", r["nodata"]
    _expect(r["batch_true"], "ValueError: Session: batch_size must be a positive int, got True")
    _expect(r["lr_neg"], "ValueError: Session: lr must be a finite number > 0.0, got -1.0")
    _expect(r["lr_str"], "ValueError: Session: lr must be a finite number > 0.0, got '0.1'")
    _expect(r["ck_int"], "ValueError: Session: checkpoint must be a file name (a non-empty str), got 5")
    r["missing"] = r["missing"].split(": ", 1)[1]      # FileNotFoundError (CPython) / OSError
    assert r["missing"].startswith("Session: no checkpoint at '%s/e/model.mfck'; %s/e has " % (ROOT, ROOT)), r["missing"]
    assert r["missing"].endswith(": open one with finetune.Session('dupes.mfck')"), r["missing"]
    for name in ("dupes", "meanlen", "nodata", "outputs", "shape", "std0", "stdneg"):
        assert name + ".mfck" in r["missing"], r["missing"]


ROOT = None


def main(argv):
    global ROOT
    ROOT = argv[1]
    r = run(ROOT)
    check(r)
    print("SESSION MODELS OK")


if __name__ == "__main__":
    main(sys.argv)
