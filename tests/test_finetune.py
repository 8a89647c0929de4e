"""board/finetune.py: the on-board REPL session, under CPython and inside real MicroPython.

The same checks (SCRIPT below) run in both interpreters against a flash folder in tmp_path that
holds what `make deploy` puts on the board: iris.mfck (from host/pretrain.py) and data/iris.csv.
"""
import json
import re
import os
import shutil
import sys

import pytest

import helpers
from test_pretrain import pretrained_checkpoint

BOARD = os.path.join(helpers.ROOT, "board")
if BOARD not in sys.path:
    sys.path.insert(0, BOARD)

# Runs under CPython and MicroPython: run(root_a, root_b) -> a dict of results (JSON-able).
SCRIPT = r'''
import gc
import os
import sys

import finetune
from microformer import checkpoint


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
    r["user_file"] = open(a + "/data/user.csv").read()

    # a bad line in the user file names the file and the line
    with open(a + "/data/user.csv", "a") as f:
        f.write("6.0,abc,4.0,1.0,versicolor\n")
    r["bad_user_file"] = err(finetune.Session, "iris.mfck", "data/iris.csv", "data/user.csv",
                             0.02, 16, a, None, False)
    s.clear_examples()

    # a corrupt checkpoint: the CheckpointError message
    data = bytearray(open(a + "/iris.mfck", "rb").read())
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
    s.freeze("embed", "head")
    r["frozen_summary"] = s.trainable_summary()

    # save, then a new Session loads bit-identical weights and the fit history
    s.save()
    s3 = finetune.Session(root=a, verbose=False)
    r["reload_same"] = snap(s3.model) == snap(s.model)
    r["history"] = len(s3.meta["history"])

    # the drift story on a fresh flash folder (one Session alive, as on the board)
    del s, s2, s3
    gc.collect()
    r["demo"] = finetune.demo(root=b)

    # a heap too small for the model: MemoryError naming the need and the free heap
    if hasattr(gc, "mem_free"):
        gc.collect()
        ballast = []
        while gc.mem_free() > 40000:
            try:
                ballast.append(bytearray(1024))
            except MemoryError:
                break
        def small():
            t = finetune.Session(root=b, verbose=False)
            t.fit(1, "train", None, False)
        r["oom"] = err(small)
        ballast = None
    return r


if __name__ == "__main__":
    import json
    res = run(sys.argv[1], sys.argv[2])
    with open(sys.argv[3], "w") as f:
        f.write(json.dumps(res))
'''


def _flash(folder):
    ckpt, _ = pretrained_checkpoint()
    os.makedirs(os.path.join(folder, "data"))
    shutil.copy(ckpt, os.path.join(folder, "iris.mfck"))
    shutil.copy(os.path.join(helpers.ROOT, "datasets", "iris.csv"), os.path.join(folder, "data", "iris.csv"))
    return str(folder)


def _check(r, interp):
    assert r["test_acc"] >= 0.93, r
    assert r["train_acc"] >= 0.99, r
    assert sum(n for _, n in r["per_class"]) == 30 and sum(c for c, _ in r["per_class"]) == 28
    assert r["predict"][0] == "virginica" and abs(r["predict"][1] - 1) < 1e-6
    assert r["predict_setosa"] == "setosa"

    assert r["bad_predict"] == ("ValueError: predict: expected 4 features (sepal_length, sepal_width, "
                                "petal_length, petal_width), got [5.9, 3.0, 5.1]")
    assert r["bad_label"] == ("ValueError: add_example: unknown label 'versicolour' (expected one of "
                              "setosa, versicolor, virginica)")
    assert r["bad_value"] == "ValueError: add_example: feature 2 (sepal_width) must be a number, got '2.8'"
    assert r["bad_part"] == ("ValueError: freeze: unknown part 'decoder' (expected 'embed', 'attention', "
                             "'head', 'all' or a layer index 0..5)")
    assert r["bad_data"].startswith("ValueError: evaluate: data must be one of 'train', 'test', 'base', "
                                    "'user', 'all' or a list"), r["bad_data"]
    assert "no user examples yet" in r["no_user"], r["no_user"]
    assert r["user_after_bad"] == 0

    assert r["user_reloaded"] == 2
    assert r["user_file"] == ("sepal_length,sepal_width,petal_length,petal_width,label\n"
                              "6.1,2.8,4.7,1.2,versicolor\n6.3,3.3,6,2.5,virginica\n")
    assert r["bad_user_file"].startswith("ValueError: Session: ") and \
        "data/user.csv line 4, column 2 (sepal_width): 'abc' is not a number" in r["bad_user_file"], r["bad_user_file"]
    assert r["bad_ckpt"].startswith("CheckpointError: checkpoint ") and "bad.mfck" in r["bad_ckpt"] \
        and "bad CRC" in r["bad_ckpt"], r["bad_ckpt"]

    assert r["fit_steps"] == 16
    assert r["frozen_same"] and r["others_changed"]
    assert "(frozen)" not in r["unfrozen_summary"]
    assert r["frozen_summary"] == ("trainable params 288 of 475: 0 Dense (frozen), 3 Attention, "
                                   "5 Dense (frozen)")
    assert r["reload_same"] and r["history"] == 1

    d = r["demo"]
    assert d["before"] <= 0.6 and d["after"] >= 0.8 and d["after"] - d["before"] >= 0.3, d
    assert d["reloaded"] == d["after"], d
    if interp == "micropython":
        assert r["oom"].startswith("MemoryError: Session: out of memory"), r["oom"]
        # 475 params x 4 bytes x (weight, grad, Adam m, Adam v, and the step's snapshot of weight,
        # m and v) = 13300; the need adds the activations
        m = re.search(r"the model needs about (\d+) bytes: 475 params = 13300 bytes with grads, Adam state "
                      r"and the step's snapshot, "
                      r"activations for a batch of 16 = (\d+) bytes; free heap \d+ bytes", r["oom"])
        assert m, r["oom"]
        assert int(m.group(1)) == 13300 + int(m.group(2)) and int(m.group(2)) > 16 * 4 * 32, r["oom"]


def test_session_cpython(tmp_path):
    a, b = _flash(tmp_path / "a"), _flash(tmp_path / "b")
    script = tmp_path / "ft_script.py"
    script.write_text(SCRIPT)
    ns = {"__name__": "ft_script"}
    exec(compile(SCRIPT, str(script), "exec"), ns)
    r = json.loads(json.dumps(ns["run"](a, b)))
    _check(r, "cpython")


def test_session_micropython(tmp_path, micropython):
    a, b = _flash(tmp_path / "a"), _flash(tmp_path / "b")
    script = tmp_path / "ft_script.py"
    script.write_text("import sys\nsys.path.append(%r)\n" % BOARD + SCRIPT)
    out = tmp_path / "out.json"
    helpers.run_micropython(str(script), a, b, str(out), heap="512K", exe=micropython)
    r = json.loads(out.read_text())
    _check(r, "micropython")


def test_module_imports_without_board_files():
    import finetune
    assert finetune.CHECKPOINT == "iris.mfck" and finetune.DATA == "data/iris.csv"
    assert finetune.USER_DATA == "data/user.csv"
    with pytest.raises(OSError):
        finetune.Session(root="/nonexistent-flash", verbose=False)


def test_ctrl_c_during_fit_keeps_last_full_step(tmp_path, capsys):
    import finetune
    a = _flash(tmp_path / "a")
    s = finetune.Session(root=a, verbose=True)
    calls = {"n": 0}
    forward = s.model.forward

    def interrupting_forward(x):
        calls["n"] += 1
        if calls["n"] == 4:                 # during the 4th step: 3 full steps are done
            raise KeyboardInterrupt
        return forward(x)

    s.model.forward = interrupting_forward
    hist = s.fit(epochs=3, data="train")
    out = capsys.readouterr().out
    assert hist[-1]["interrupted"] and len(hist) == 1 and hist[0]["steps"] == 3
    assert "interrupted: stopped after 3 full steps" in out
    assert s._opt.steps == 3 and s.meta["history"][-1]["interrupted"]
    # the weights are those of 3 full steps: a fresh session doing 3 steps on the same batches agrees
    s.model.forward = forward
    w = {k: bytes(p.data) for k, p in s.model.named_params()}
    t = finetune.Session(root=a, verbose=False)
    t.model.forward = forward_limit(t.model.forward, 3)
    t.fit(epochs=1, data="train", verbose=False)
    assert {k: bytes(p.data) for k, p in t.model.named_params()} == w
    # and the session goes on: fit and save work
    s.fit(epochs=1, data="train", verbose=False)
    s.save()
    assert len(finetune.Session(root=a, verbose=False).meta["history"]) == 2


def forward_limit(forward, n):
    calls = {"n": 0}

    def f(x):
        calls["n"] += 1
        if calls["n"] > n:
            raise KeyboardInterrupt
        return forward(x)
    return f
