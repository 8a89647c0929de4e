# Data boundaries: every NaN / inf / malformed reading is refused with a message naming where it is.
# Runs under CPython and MicroPython:
#   MICROPYPATH=lib:board:board/demos:board/benchmarks:tests/mp micropython tests/mp/trust_data_mp.py FLASH_DIR BACKEND OUT.json
# (FLASH_DIR: an empty folder; the script writes an untrained Iris checkpoint and the CSVs there).
import json
import os
import sys

import microformer as mf
from microformer import data as mfdata

FEATURES = ["sepal_length", "sepal_width", "petal_length", "petal_width"]
CLASSES = ["setosa", "versicolor", "virginica"]
ROWS = ["5.1,3.5,1.4,0.2,setosa", "7.0,3.2,4.7,1.4,versicolor", "6.3,3.3,6.0,2.5,virginica",
        "4.9,3.0,1.4,0.2,setosa", "6.4,3.2,4.5,1.5,versicolor", "5.8,2.7,5.1,1.9,virginica"]
HEADER = ",".join(FEATURES) + ",species"


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def err(fn, *args):
    try:
        fn(*args)
    except Exception as e:          # the type and message are what the test checks
        return "%s: %s" % (type(e).__name__, e)
    return "no error"


def weights(model):
    return [bytes(p.data) for _, p in model.named_params()]


def make_flash(root):
    import finetune
    try:
        os.mkdir(root + "/data")
    except OSError:
        pass
    write(root + "/data/iris.csv", HEADER + "\n" + "\n".join(ROWS) + "\n")
    from microformer.models import iris_model
    model = iris_model(1)               # checkpoint.save writes its spec
    meta = {"arch": "iris-attention-v1", "classes": CLASSES,
            "features": FEATURES, "mean": [5.8, 3.0, 3.8, 1.2], "std": [0.8, 0.4, 1.8, 0.8],
            "split_seed": 0, "n_train": 4, "init_seed": 1, "data": "iris.csv"}
    mf.save_checkpoint(root + "/model.mfck", model, meta)
    return finetune


BACKEND = [None]


def run(root, backend):
    mf.set_backend(backend)
    BACKEND[0] = backend
    r = {}
    inf = float("inf")
    nan = float("nan")
    d = root + "/csv"
    try:
        os.mkdir(d)
    except OSError:
        pass

    # ---- read_csv: one reader, every fault named by file, line, column
    def csv(name, lines, **kw):
        p = d + "/" + name
        write(p, "\n".join(lines) + "\n")
        return err(mfdata.read_csv, p, *([kw["classes"]] if "classes" in kw else []))

    r["csv_nan"] = csv("nan.csv", [HEADER, ROWS[0], "nan,3.0,1.4,0.2,setosa"])
    r["csv_inf"] = csv("inf.csv", [HEADER, ROWS[0], ROWS[1], "5.0,-inf,1.4,0.2,setosa"])
    r["csv_1e39"] = csv("big.csv", [HEADER, "5.0,3.0,1e39,0.2,setosa"])
    r["csv_text"] = csv("text.csv", [HEADER, ROWS[0], "5.0,3.0,abc,0.2,setosa"])
    r["csv_short"] = csv("short.csv", ["a,b,label", "1,2"])
    r["csv_long"] = csv("long.csv", ["a,b,label", "1,2,x", "1,2,3,x"])
    r["csv_nolabel"] = csv("nolabel.csv", ["a,b,label", "1,2,x", "3,4,"])
    r["csv_missing"] = err(mfdata.read_csv, d + "/no-such-file.csv")
    # a file without a header: every row is data (none dropped), features get generic names
    write(d + "/nohead.csv", "\n".join(ROWS) + "\n")
    ds = mfdata.read_csv(d + "/nohead.csv")
    r["nohead_rows"] = len(ds)
    r["nohead_first"] = ds.row(0)
    r["nohead_strict"] = err(mfdata.read_csv, d + "/nohead.csv", None, True)
    write(d + "/good.csv", HEADER + "\n" + "\n".join(ROWS) + "\n")
    ds = mfdata.read_csv(d + "/good.csv")
    r["good_rows"] = len(ds)
    r["good_features"] = ds.features

    # ---- Dataset, Sequential input
    X = mf.Tensor.from_list([[1.0, 2.0], [3.0, nan], [5.0, 6.0]])
    r["dataset_nan"] = err(mfdata.Dataset, X, [0, 1, 0])
    X = mf.Tensor.from_list([[1.0, 2.0], [3.0, 4.0], [inf, 6.0]])
    r["dataset_inf"] = err(mfdata.Dataset, X, [0, 1, 0], ["a", "b"], ["width", "height"])
    r["dataset_label"] = err(mfdata.Dataset, mf.Tensor.from_list([[1.0], [2.0]]), [0, 3], ["a", "b"])
    mf.seed(1)
    model = mf.Sequential([mf.Dense(2, 4), mf.ActivationLayer("relu"), mf.Dense(4, 2)])
    r["forward_nan"] = err(model.forward, mf.Tensor.from_list([[1.0, 2.0], [nan, 1.0]]))
    r["forward_inf"] = err(model.forward, mf.Tensor.from_list([[1.0, -inf]]))
    ds = mfdata.Dataset(mf.Tensor.from_list([[1.0, 2.0], [3.0, 4.0]]), [0, 1], ["a", "b"])
    from microformer.train import evaluate
    model3 = mf.Sequential([mf.Dense(2, 3)])
    r["evaluate_width"] = err(evaluate, model3, ds)

    # ---- errors that name the thing and expected vs got
    logits = mf.Tensor.from_list([[1.0, 2.0]])
    r["ce_none"] = err(mf.CrossEntropyLoss().forward, logits, None)
    r["summary_attention"] = err(mf.Sequential([mf.Attention(8, 2)]).summary, (2, 8), 2, False)
    r["summary_dense"] = err(mf.Sequential([mf.Dense(4, 8), mf.Dense(5, 2)]).summary, (2, 4), 2, False)
    r["show_before_forward"] = err(mf.show, mf.Attention(8, 2))
    r["reshape_int"] = err(mf.Reshape, 4)
    r["layernorm_eps_inf"] = err(mf.LayerNorm, 4, inf)
    r["layernorm_eps_nan"] = err(mf.LayerNorm, 4, nan)
    r["layernorm_eps_0"] = err(mf.LayerNorm, 4, 0.0)

    # ---- large finite inputs: attention and LayerNorm give the right answer (portable math)
    g = mf.Rng(7)
    big = {}
    for scale in ((1.0, 1e10, 1e20) if backend == "python" else ()):   # viper: its own kernels
        mf.seed(5)
        a = mf.Attention(8, 2)
        x = mf.Tensor.from_list([[[g.uniform(-1, 1) * scale for _ in range(8)] for _ in range(5)]])
        y = a.forward(x)
        big["attn %g" % scale] = {"x": list(x.data), "y": list(y.data),
                                  "p": dict((n, list(t.data)) for n, t in
                                            mf.Sequential([a]).named_params())}
    for scale in (1.0, 1e20, 1e30):
        ln = mf.LayerNorm(6)
        x = mf.Tensor.from_list([[g.uniform(-1, 1) * scale for _ in range(6)] for _ in range(3)])
        big["ln %g" % scale] = {"x": list(x.data), "y": list(ln.forward(x).data)}
    r["big"] = big

    # ---- the board session
    finetune = make_flash(root)
    user = root + "/data/user.csv"
    r["session_missing"] = err(finetune.Session, "nope.mfck", "data/iris.csv", "data/user.csv",
                               0.02, 16, root, None, False)
    s = finetune.Session(root=root, verbose=False, backend=backend)
    w0 = weights(s.model)
    r["add_inf"] = err(s.add_example, [inf, 3.0, 4.0, 1.0], "setosa")
    r["add_1e39"] = err(s.add_example, [1e39, 3.0, 4.0, 1.0], "setosa")
    r["add_nan"] = err(s.add_examples, [([5.0, 3.0, 4.0, 1.0], "setosa"), ([5.0, nan, 4.0, 1.0], 1)])
    r["user_file_after_bad_adds"] = read(user)
    r["examples_after_bad_adds"] = s.num_examples()
    r["predict_inf"] = err(s.predict, [inf, 3.0, 4.0, 1.0])
    r["predict_1e39"] = err(s.predict, [5.0, 3.0, 4.0, -1e39])
    r["fit_list_nan"] = err(s.fit, 1, [([5.0, 3.0, 4.0, 1.0], "setosa"), ([5.0, 3.0, nan, 1.0], "setosa")])
    r["evaluate_list_inf"] = err(s.evaluate, [([5.0, 3.0, 4.0, 1.0], "setosa"), ([inf, 3.0, 4.0, 1.0], 0)])
    r["weights_unchanged"] = weights(s.model) == w0
    # a NaN row already in the user's file: the session refuses to load it, naming file and line
    write(user, HEADER.replace("species", "label") + "\n" + ROWS[0] + "\n5.0,nan,1.4,0.2,setosa\n")
    r["session_nan_row"] = err(finetune.Session, "model.mfck", "data/iris.csv", "data/user.csv",
                               0.02, 16, root, None, False)
    os.remove(user)
    # a good example still goes through, and the session reads it back with the same reader
    s.add_example([6.1, 2.8, 4.7, 1.2], "versicolor")
    s2 = finetune.Session(root=root, verbose=False, backend=backend)
    r["reloaded_examples"] = s2.num_examples()
    r["session_lr_inf"] = err(finetune.Session, "model.mfck", "data/iris.csv", "data/user.csv",
                              inf, 16, root, None, False)
    r["fit_lr_inf"] = err(s.fit, 1, "user", inf)
    r["fit_lr_nan"] = err(s.fit, 1, "user", nan)
    fit_calls(r, finetune, root)
    return r


def fit_calls(r, finetune, root):
    """fit checks every argument before it changes anything, and a refused step rolls the whole
    call back (weights, Adam state, step count, lr); on_error='keep' keeps the good steps."""
    def state(s):
        return weights(s.model) + ([bytes(t.data) for t in s._opt.m + s._opt.v] if s._opt else []) + \
            [s._opt.steps if s._opt else None, s.lr]
    s = finetune.Session(root=root, verbose=False, batch_size=1, backend=BACKEND[0])    # 4 steps an epoch
    s.fit(1, "train")
    before = state(s)
    for tag, kw in (("epochs_neg", {"epochs": -1, "lr": 0.5}), ("epochs_str", {"epochs": "5"}),
                    ("epochs_bool", {"epochs": True}), ("epochs_0", {"epochs": 0}),
                    ("lr_neg", {"lr": -0.1}), ("verbose_str", {"verbose": "yes", "lr": 0.5}),
                    ("on_error", {"on_error": "undo", "lr": 0.5}), ("data", {"data": "nope", "lr": 0.5})):
        r["fitarg_" + tag] = err(lambda: s.fit(**kw))
        r["fitarg_" + tag + "_unchanged"] = state(s) == before
    # lr 1e30: the first step makes weights of ~1e30 (finite), the next one's loss is not
    r["rollback_err"] = err(s.fit, 1, "train", 1e30)
    r["rollback_unchanged"] = state(s) == before
    r["rollback_records"] = len(s.meta["history"])
    r["keep_err"] = err(lambda: s.fit(1, "train", 1e30, on_error="keep"))
    r["keep_changed"] = weights(s.model) != before[:len(weights(s.model))]
    r["keep_steps"] = s._opt.steps - before[-2]
    r["keep_record"] = [s.meta["history"][-1].get(k) for k in ("steps", "error")]
    r["keep_records"] = len(s.meta["history"])


if __name__ == "__main__":
    res = run(sys.argv[1], sys.argv[2])
    with open(sys.argv[3], "w") as f:
        f.write(json.dumps(res))
