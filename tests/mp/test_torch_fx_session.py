"""A torch model with its own forward, converted on the command line with session metadata, opens
in the board's finetune.Session (here on CPython and both MicroPython ports): its parts are frozen
by the module's own names ('conv'), a fit leaves them as they were and trains the rest, and the
saved checkpoint goes back into the user's own class."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import fx_models
import helpers
from torch_compare import torch
import torch_io  # noqa: E402

TORCH_IO = os.path.join(helpers.TOOLS, "torch_io.py")
CLASSES = ["still", "wave", "shake", "tap", "swipe"]
L, C = 50, 3

SESSION_RUN = r'''
import json
import sys

import finetune

s = finetune.Session(root=sys.argv[1], verbose=False)
frozen = s.freeze("conv")
before = dict((k, list(v.data)) for k, v in s.model.state_dict().items())
s.fit(epochs=2, data="train")
after = dict((k, list(v.data)) for k, v in s.model.state_dict().items())
s.save()
print(json.dumps({"frozen": frozen, "same": sorted(k for k in before if before[k] == after[k])}))
'''


def _windows(n, seed):
    rng = np.random.default_rng(seed)
    X, y = [], []
    for i in range(n):
        k = i % len(CLASSES)
        t = np.arange(L)[:, None] + rng.uniform(0, 50)
        X.append(np.sin(2 * np.pi * (0.03 + 0.05 * k) * t) * (1 + np.arange(C)) + rng.normal(0, 0.1, (L, C)))
        y.append(k)
    return np.asarray(X, np.float32), y


def _flash(tmp_path):
    path, mod = helpers.user_module(tmp_path, "gesture", fx_models.MODELS_PY)
    tm = fx_models.randomize(torch, mod.GestureNet(), 1)
    pt = tmp_path / "gesture.pt"
    torch.save(tm.state_dict(), pt)
    flash = tmp_path / "flash"
    (flash / "data").mkdir(parents=True)
    X, y = _windows(20, 0)
    with open(str(flash / "data" / "gestures.csv"), "w") as f:
        f.write(",".join("t%d_c%d" % (t, c) for t in range(L) for c in range(C)) + ",label\n")
        for w, k in zip(X, y, strict=True):
            f.write(",".join("%.5g" % v for v in w.reshape(-1)) + "," + CLASSES[k] + "\n")
    (tmp_path / "meta.json").write_text(json.dumps({"classes": CLASSES, "data": "gestures.csv"}))
    r = subprocess.run([sys.executable, TORCH_IO, str(pt), "--model", "%s:GestureNet" % path, "--meta",
                        str(tmp_path / "meta.json"), "--input-shape", "%d,%d" % (L, C), "--out",
                        str(flash / "model.mfck")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return flash, mod, tm


def _check(out, flash, mod, tm):
    r = json.loads(out.strip().splitlines()[-1])
    assert r["frozen"] == ["conv.weight", "conv.bias"]
    assert r["same"] == ["conv.bias", "conv.weight"]      # everything else trained
    back = torch_io.load_into(mod.GestureNet(), str(flash / "model.mfck"))
    for k, v in tm.state_dict().items():
        assert torch.equal(back.state_dict()[k], v) == k.startswith("conv."), k


def test_session_freezes_by_the_modules_names(tmp_path):
    flash, mod, tm = _flash(tmp_path)
    (tmp_path / "run.py").write_text(SESSION_RUN)
    _check(helpers.run_cpython(str(tmp_path / "run.py"), str(flash)), flash, mod, tm)


@pytest.mark.slow
def test_session_freezes_by_the_modules_names_on_micropython(tmp_path, micropython):
    flash, mod, tm = _flash(tmp_path)
    (tmp_path / "run.py").write_text(SESSION_RUN)
    _check(helpers.run_micropython(str(tmp_path / "run.py"), str(flash), exe=micropython, heap="8M"), flash, mod, tm)
