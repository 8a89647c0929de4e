# board/finetune.py's REPL session, checked under CPython and inside MicroPython, directly
#   MICROPYPATH=lib:board:board/demos:board/benchmarks:tests/mp micropython tests/mp/finetune_session_mp.py FLASH_A FLASH_B
# FLASH_A and FLASH_B: folders holding what `make deploy` puts on a board (model.mfck from
# host/tools/pretrain.py and data/iris.csv); the session writes into them. Prints FINETUNE OK or
# raises AssertionError (tests/mp/test_finetune.py runs it on every interpreter).
import gc
import sys

import finetune
from iris_seed_mp import SEED_TEST

MICRO = sys.implementation.name == "micropython"


def snap(model, layers=None):
    out = {}
    for name, p in model.named_params():
        if layers is None or int(name.split(".")[0]) in layers:
            out[name] = bytes(p.data)
    return out


def err(fn, *args):
    try:
        fn(*args)
    except (ValueError, MemoryError) as e:
        return "%s: %s" % (type(e).__name__, e)
    return "no error"


def run(a, b):
    r = {}
    s = finetune.Session(root=a, verbose=False)
    ev = s.evaluate()
    r["test_acc"] = ev["accuracy"]
    r["meta_test_acc"] = s.meta["test_acc"]
    r["meta_train_acc"] = s.meta["train_acc"]
    r["n_train"] = s.meta["n_train"]
    r["n_rows"] = len([l for l in open(a + "/data/iris.csv") if l.strip()]) - 1    # minus the header
    r["batch_size"] = s.batch_size
    r["params"] = s.model.param_count()
    r["layer_params"] = [(type(l).__name__, l.param_count()) for l in s.model.layers]
    r["summary"] = s.model.summary((s.batch_size, 4), show=False)
    r["per_class"] = [list(ev["per_class"][c]) for c in s.classes]
    r["train_acc"] = s.evaluate("train")["accuracy"]
    label, probs = s.predict([5.9, 3.0, 5.1, 1.8])
    r["predict"] = [label, sum(probs)]
    r["predict_setosa"] = s.predict([5.0, 3.4, 1.5, 0.2])[0]

    # bad input
    r["bad_predict"] = err(s.predict, [5.9, 3.0, 5.1])
    r["bad_label"] = err(s.add_example, [6.1, 2.8, 4.7, 1.2], "versicolour")
    r["bad_value"] = err(s.add_example, [6.1, "2.8", 4.7, 1.2], "versicolor")
    r["bad_part"] = err(s.freeze, "decoder")
    r["bad_data"] = err(s.evaluate, "validation")
    r["no_user"] = err(s.fit, 1, "user")
    r["user_after_bad"] = s.num_examples()

    # add_example persists; a new Session sees it
    s.add_example([6.1, 2.8, 4.7, 1.2], "versicolor")
    s.add_example([6.3, 3.3, 6.0, 2.5], 2)
    s2 = finetune.Session(root=a, verbose=False)
    r["user_reloaded"] = s2.num_examples()
    del s2                  # one Session alive at a time, as on the board
    gc.collect()
    r["user_file"] = open(a + "/data/user.csv").read()

    # a bad line in the user file names the file and the line
    with open(a + "/data/user.csv", "a") as f:
        f.write("6.0,abc,4.0,1.0,versicolor\n")
    r["bad_user_file"] = err(finetune.Session, "model.mfck", "data/iris.csv", "data/user.csv",
                             0.02, 16, a, None, False)
    s.clear_examples()

    # a corrupt checkpoint: the CheckpointError message
    data = bytearray(open(a + "/model.mfck", "rb").read())
    data[len(data) // 2] ^= 0x40
    with open(a + "/bad.mfck", "wb") as f:
        f.write(data)
    r["bad_ckpt"] = err(finetune.Session, "bad.mfck", "data/iris.csv", "data/user.csv",
                        0.02, 16, a, None, False)

    # freeze keeps the frozen weights bit-identical while the others change
    s.freeze("attention")
    before = snap(s.model)
    hist = s.fit(epochs=2, data="train", verbose=False)
    after = snap(s.model)
    r["fit_steps"] = sum(h["steps"] for h in hist)
    r["frozen_same"] = all(before[k] == after[k] for k in before if k.startswith("3."))
    r["others_changed"] = all(before[k] != after[k] for k in before if not k.startswith("3."))
    s.unfreeze()
    r["unfrozen_summary"] = s.trainable_summary()
    r["frozen_names"] = s.freeze("embed", "head")
    r["frozen_summary"] = s.trainable_summary()
    r["param_names"] = [name for name, _, _, _ in s.parts(False)]
    r["state_names"] = list(s.model.state_dict().keys())

    # save, then a new Session loads bit-identical weights and the fit history
    s.save()
    s3 = finetune.Session(root=a, verbose=False)
    r["reload_same"] = snap(s3.model) == snap(s.model)
    r["history"] = len(s3.meta["history"])

    # the drift story on a fresh flash folder (one Session alive, as on the board)
    del s, s3
    gc.collect()
    r["demo"] = finetune.demo(root=b)

    # a heap too small for the model: MemoryError naming the need and the free heap
    if hasattr(gc, "mem_free"):
        gc.collect()
        t = finetune.Session(root=b, verbose=False)
        gc.collect()
        ballast = []                # what is left is less than fit needs (the model's 45 KB)
        while gc.mem_free() > 30000:
            try:
                ballast.append(bytearray(1024))
            except MemoryError:
                break
        try:
            t.fit(1, "train", None, False)
            r["oom"] = "no error"
        except MemoryError as e:
            import sys
            sys.print_exception(e)
            r["oom"] = "%s: %s" % (type(e).__name__, e)
        ballast = t = None
    return r


def _expect(got, want):
    assert got == want, "got %r\nwant %r" % (got, want)


def check(r):
    # the session scores the checkpoint's weights as the host did
    assert r["test_acc"] == r["meta_test_acc"] and r["test_acc"] >= SEED_TEST - 1e-9, r["test_acc"]
    assert r["train_acc"] == r["meta_train_acc"], (r["train_acc"], r["meta_train_acc"])
    n_test = sum(n for _, n in r["per_class"])
    assert n_test == r["n_rows"] - r["n_train"], r["per_class"]
    assert sum(c for c, _ in r["per_class"]) == round(r["test_acc"] * n_test), r["per_class"]
    assert r["predict"][0] == "virginica" and abs(r["predict"][1] - 1) < 1e-6, r["predict"]
    assert r["predict_setosa"] == "setosa"

    _expect(r["bad_predict"], "ValueError: predict: expected 4 features (sepal_length, sepal_width, "
                              "petal_length, petal_width), got [5.9, 3.0, 5.1]")
    _expect(r["bad_label"], "ValueError: add_example: unknown label 'versicolour' (expected one of "
                            "setosa, versicolor, virginica)")
    _expect(r["bad_value"], "ValueError: add_example: feature 2 (sepal_width) must be a number, got '2.8'")
    # an unknown part lists what is valid: the kinds this model has, the layer range, every name
    assert r["bad_part"].startswith("ValueError: freeze: unknown part 'decoder'; valid: kinds 'attention', "
                                    "'head', 'input', 'bias', 'all'; a layer index 0..%d; a name, a prefix "
                                    "or a glob of " % (len(r["layer_params"]) - 1)), r["bad_part"]
    assert r["bad_part"].endswith(", ".join(r["state_names"])), r["bad_part"]
    assert r["bad_data"].startswith("ValueError: evaluate: data must be one of 'train', 'test', 'base', "
                                    "'user', 'all' or a list"), r["bad_data"]
    assert "no user examples yet" in r["no_user"], r["no_user"]
    assert r["user_after_bad"] == 0

    assert r["user_reloaded"] == 2
    _expect(r["user_file"], "sepal_length,sepal_width,petal_length,petal_width,label\n"
                            "6.1,2.8,4.7,1.2,versicolor\n6.3,3.3,6,2.5,virginica\n")
    assert r["bad_user_file"].startswith("ValueError: Session: ") and \
        "data/user.csv line 4, column 2 (sepal_width): 'abc' is not a number" in r["bad_user_file"], r["bad_user_file"]
    assert r["bad_ckpt"].startswith("CheckpointError: checkpoint ") and "bad.mfck" in r["bad_ckpt"] \
        and "bad CRC" in r["bad_ckpt"], r["bad_ckpt"]

    # 2 epochs over the training split in batches
    assert r["fit_steps"] == 2 * ((r["n_train"] + r["batch_size"] - 1) // r["batch_size"]), r["fit_steps"]
    assert r["frozen_same"] and r["others_changed"]
    _expect(r["unfrozen_summary"], "trainable params %d of %d; frozen: none" % (r["params"], r["params"]))
    # the session's names are the model's state_dict keys
    _expect(r["param_names"], r["state_names"])
    # freeze("embed", "head"): the first and the last Dense; what stays trainable is counted
    first, last = 0, len(r["layer_params"]) - 1
    want = [k for k in r["state_names"] if k.split(".")[0] in (str(first), str(last))]
    _expect(r["frozen_names"], want)
    live = r["params"] - r["layer_params"][first][1] - r["layer_params"][last][1]
    assert 0 < live < r["params"]
    _expect(r["frozen_summary"], "trainable params %d of %d; frozen: %s" % (live, r["params"], ", ".join(want)))
    assert r["reload_same"] and r["history"] == 1

    d = r["demo"]
    assert d["before"] <= 0.6 and d["after"] >= 0.8 and d["after"] - d["before"] >= 0.3, d
    assert d["reloaded"] == d["after"], d
    if MICRO:
        import re
        assert r["oom"].startswith("MemoryError: Session: out of memory"), r["oom"]
        m = re.search(r"the model needs about (\d+) bytes: (\d+) params = (\d+) bytes with grads, Adam state "
                      r"and the step's snapshot, activations for a batch of (\d+) = (\d+) bytes; free heap \d+ bytes",
                      r["oom"])
        assert m, r["oom"]
        p = r["params"]
        need = r["summary"]
        # 4 bytes x (weight, grad, Adam m, Adam v, and the step's snapshot of weight, m and v)
        assert int(m.group(2)) == p and int(m.group(3)) == 4 * 7 * p == need["param_bytes"], r["oom"]
        assert int(m.group(4)) == r["batch_size"] and int(m.group(5)) == need["activation_bytes"], r["oom"]
        assert int(m.group(1)) == int(m.group(3)) + int(m.group(5)) == need["total_bytes"], r["oom"]


def main(argv):
    r = run(argv[1], argv[2])
    check(r)
    print("FINETUNE OK test_acc %.4f demo %.4f -> %.4f" % (r["test_acc"], r["demo"]["before"], r["demo"]["after"]))


if __name__ == "__main__":
    main(sys.argv)
