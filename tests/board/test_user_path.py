"""A new user's own model, end to end, as the README's "From PyTorch" section tells it: two torch
models of shapes the project never shipped (a sequence classifier with a TransformerEncoderLayer
on [B, L, C] windows, and a channels-first Conv1d sensor model on [B, C, L]) are trained in
torch, saved as a state_dict, converted with `host/tools/torch_io.py --model FILE.py:FACTORY` and a
minimal meta.json, deployed with `make deploy CHECKPOINT=...` to the virtual board (one the project
was deployed to before, as a redeploy finds it: conftest.deployed_flash), opened with
`finetune.Session()`, frozen by name, fine-tuned on windows captured from a simulated sensor
(`mf_capture.capture`), saved, copied back with mpremote, converted back into the user's own
module, and run in torch: its outputs equal the board's (<= 1e-5 on the portable backend, within
the viper bound on viper). The same again with Ctrl-C typed in the middle of the fit."""
import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

import helpers
from torch_compare import torch
from torch import nn  # noqa: E402

import board_link  # noqa: E402
import vboard  # noqa: E402
from test_trust_board import STOCK_REASON, Term  # noqa: E402

pytestmark = pytest.mark.board

TORCH_IO = os.path.join(helpers.TOOLS, "torch_io.py")
MICROPYTHON = helpers.interpreter_path(helpers.interpreters()[-1])
C, L, K = 3, 16, 3
CLASSES = ["still", "walk", "run"]
FREQ = (0.0, 0.15, 0.35)          # cycles per reading of each class's motion

# the user's own model file (what --model FILE.py:FACTORY imports)
MODELS_PY = '''
from torch import nn
import torch_io


def sequence():
    return nn.Sequential(nn.Linear({C}, 8),
                         nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True),
                         torch_io.GlobalAvgPool(), nn.Linear(8, {K}))


def conv():
    return nn.Sequential(nn.Conv1d({C}, 6, 5, padding=2), nn.ReLU(), nn.MaxPool1d(2), nn.Flatten(),
                         nn.Linear(6 * {L} // 2, {K}))
'''.format(C=C, L=L, K=K)

# the simulated sensor on the board: one reading of C channels per call, the motion of class k
SENSOR = '''
import math
class Sensor:
    def __init__(self, k, seed):
        self.k = k
        self.t = seed
    def read(self):
        self.t += 1
        f = %r[self.k]
        return [math.sin(6.2832 * f * self.t) * (1 + c) + 0.1 * c for c in range(%d)]
''' % (FREQ, C)


def windows(k, n, seed):
    """n windows [L, C] of class k, as the board's Sensor produces them (t from seed+1)."""
    out = []
    t = seed
    for _ in range(n):
        w = []
        for _ in range(L):
            t += 1
            w.append([np.sin(6.2832 * FREQ[k] * t) * (1 + c) + 0.1 * c for c in range(C)])
        out.append(w)
    return np.asarray(out, np.float32)


def user_models(tmp_path):
    return helpers.user_module(tmp_path, "mymodels", MODELS_PY)


def torch_in(kind, x):
    """What the user's torch module takes for windows x [B, L, C]."""
    t = torch.tensor(x)
    return t.transpose(1, 2) if kind == "conv" else t


def train_in_torch(kind, module):
    torch.manual_seed(0)
    X = np.concatenate([windows(k, 12, 100 * k) for k in range(K)])
    y = torch.tensor([k for k in range(K) for _ in range(12)])
    opt = torch.optim.Adam(module.parameters(), lr=1e-2)
    for _ in range(40):
        opt.zero_grad()
        nn.functional.cross_entropy(module(torch_in(kind, X)), y).backward()
        opt.step()
    return module.eval()


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=helpers.ROOT, **kw)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


PROBE = np.concatenate([windows(k, 2, 5000 + k) for k in range(K)])


def board_probs(t):
    """The board session's probabilities for PROBE (printed by predict, parsed here)."""
    rows = json.dumps(PROBE.reshape(len(PROBE), -1).tolist())
    out = t.paste("import json\nfor w in json.loads(%r):\n print('P', ' '.join(repr(v) for v in "
                  "s.predict(w, verbose=False).probs))\n" % rows, timeout=120)
    got = [[float(v) for v in line.split()[1:]] for line in out.splitlines() if line.startswith("P ")]
    assert len(got) == len(PROBE), out
    return np.asarray(got)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """kind -> (the model file, its module, the torch model trained, the checkpoint torch_io.py
    made of it): trained and converted once per kind, shared by the backends and fits below."""
    made = {}

    def get(kind):
        if kind not in made:
            folder = tmp_path_factory.mktemp("user-" + kind)
            path, mods = user_models(folder)
            module = train_in_torch(kind, getattr(mods, kind)())
            torch.save(module.state_dict(), folder / "mine.pt")
            (folder / "meta.json").write_text(json.dumps({"classes": CLASSES}))
            ck = folder / "mine.mfck"
            out = run([sys.executable, TORCH_IO, str(folder / "mine.pt"), "--model", "%s:%s" % (path, kind),
                       "--meta", str(folder / "meta.json"), "--input-shape", "%d,%d" % (L, C), "--out", str(ck)])
            assert "metadata default: mean" in out, out      # the defaults it filled in are said
            made[kind] = (path, mods, module, ck)
        return made[kind]
    return get


@pytest.mark.parametrize("kind", ["sequence", "conv"])
@pytest.mark.parametrize("backend", ["python", "viper"])
@pytest.mark.parametrize("interrupt", [False, True], ids=["whole-fit", "ctrl-c"])
def test_your_model_on_the_board_and_back(tmp_path, converted, deployed_flash, kind, backend, interrupt):
    path, mods, module, ck = converted(kind)

    if interrupt and MICROPYTHON == helpers.micropython_path():
        print("\nnot run on the stock port: " + STOCK_REASON, file=sys.__stderr__)
        pytest.skip(STOCK_REASON)
    # 1M on the 32-bit port; the stock port's 64-bit objects take about twice that
    heap = "2M" if MICROPYTHON == helpers.micropython_path() else "1M"
    # a board that had the project deployed (make deploy then copies the new checkpoint)
    deployed_flash(tmp_path / "board", MICROPYTHON)
    with vboard.VirtualBoard(tmp_path / "board", heap=heap, micropython=MICROPYTHON) as b:
        out = run(["make", "--no-print-directory", "-o", ".venv/.installed", "deploy",
                   "CHECKPOINT=%s" % ck, "PORT=%s" % b.port], timeout=600)
        assert "model.mfck" in out, out
        t = Term(b.port)
        try:
            out = t.line("import finetune, mf_capture; s = finetune.Session(backend=%r)" % backend, timeout=120)
            assert re.search(r"model\.mfck: .*classes still, walk, run", out), out
            # freeze by name: everything, then the head (the last Linear) and the first layer again
            out = t.line("s.freeze('all'); s.unfreeze('head'); s.unfreeze('0')")
            assert "Traceback" not in out, out
            trainable = t.line("print(sorted(p[0] for p in s.parts(False) if p[0] not in s.frozen()))")
            names = sorted(re.findall(r"'([^']+)'", trainable))
            last = str(len(module) - 1)
            assert names == sorted(["0.weight", "0.bias", last + ".weight", last + ".bias"]), trainable
            # examples captured from the simulated sensor: 3 windows per class
            t.paste(SENSOR)
            for k, label in enumerate(CLASSES):
                out = t.line("mf_capture.capture(s, Sensor(%d, %d).read, %r, count=3, rate_hz=1000)"
                             % (k, 900 + 50 * k, label), timeout=60)
                assert "Traceback" not in out, out
            assert t.line("print('N', s.num_examples())").count("N 9") == 1
            before = board_probs(t)
            if interrupt:
                t.drain(0.05)
                # rehearse=0, on_worse='keep': the fit's own steps stay (no replay, no rollback)
                t.s.write(b"h = s.fit(epochs=2000, rehearse=0, on_worse='keep')\r")
                seen = b""
                deadline = time.monotonic() + 60
                while b"epoch 2/2000" not in seen:          # the fit is under way
                    assert time.monotonic() < deadline, seen[-500:]
                    seen += t.s.read(4096)
                time.sleep(0.5)
                t.s.write(b"\x03")
                out = t.read_until(b">>> ", timeout=120)
                assert "interrupted" in out, out[-2000:]
                assert t.line("print('I', h.interrupted, h.steps > 0)").count("I True True") == 1
            else:
                out = t.line("h = s.fit(epochs=2, verbose=False, rehearse=0, on_worse='keep'); "
                             "print('S', h.steps)", timeout=300)
                assert "S 2" in out, out          # 9 examples in one batch (16 at most): a step an epoch
            after = board_probs(t)
            assert np.abs(after - before).max() > 1e-4      # the fine-tune changed the model
            out = t.line("s.save()")
            assert "saved model.mfck" in out, out
        finally:
            t.close()
        board_link.mpremote(str(b.port), "cp", ":model.mfck", str(tmp_path / "tuned.mfck"))

    run([sys.executable, TORCH_IO, str(tmp_path / "tuned.mfck"), "--model", "%s:%s" % (path, kind),
         "--out", str(tmp_path / "tuned.pt")])
    tuned = getattr(mods, kind)()
    tuned.load_state_dict(torch.load(tmp_path / "tuned.pt", weights_only=True))
    tuned.eval()
    with torch.no_grad():
        want = torch.softmax(tuned(torch_in(kind, PROBE)), dim=1).numpy()
    # the frozen parameters came back as they went; the trained ones changed
    sd0, sd1 = module.state_dict(), tuned.state_dict()
    changed = sorted(n for n in sd0 if not torch.equal(sd0[n], sd1[n]))
    assert set(changed) <= set(names) and changed, changed
    bound = 1e-5 if backend == "python" else VIPER_PROB_BOUND
    assert np.abs(after - want).max() <= bound, (np.abs(after - want).max(), bound)


# viper's block-float products: probabilities within this of float32 math for these small models
# (README, Tolerances: the GEMM's relative error ~1e-3 of a row's scale)
VIPER_PROB_BOUND = 2e-2
