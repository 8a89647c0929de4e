"""The README's "From PyTorch" story, end to end on the virtual board: train in torch -> save the
state_dict -> host/tools/torch_io.py with the user's model file -> deploy (the board's :/model.mfck) ->
fine-tune on the board -> copy back -> the weights back into the user's own torch module."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import helpers
import microformer as mf

torch = pytest.importorskip("torch") if not os.environ.get("CI") else __import__("torch")
from torch import nn  # noqa: E402

import board_link  # noqa: E402
import deploy  # noqa: E402
import vboard  # noqa: E402

TORCH_IO = os.path.join(helpers.TOOLS, "torch_io.py")
DATA = os.path.join(helpers.ROOT, "datasets", "iris.csv")
SPLIT_SEED = 7


def _iris_split():
    ds = mf.data.read_csv(DATA)
    train, test = ds.split(120, seed=SPLIT_SEED)
    mean, std = train.stats()
    feats = [h.strip() for h in open(DATA).readline().strip().split(",")[:-1]]
    return ds, train, test, mean, std, feats


def _xy(ds, mean, std):
    x = np.asarray(ds.X.data, dtype=np.float32).reshape(ds.X.shape)
    return torch.tensor((x - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)), torch.tensor(ds.y)


# the user's own model file (host/tools/torch_io.py --model mymodel.py:build imports it)
MYMODEL_PY = """
import torch_io
from torch import nn


def build():
    return nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Unflatten(1, (4, 8)),
                         nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True, norm_first=True),
                         torch_io.GlobalAvgPool(), nn.Linear(8, 3))
"""


def _build(tmp_path):
    path = tmp_path / "mymodel.py"
    path.write_text(MYMODEL_PY)
    scope = {}
    exec(compile(MYMODEL_PY, str(path), "exec"), scope)
    return str(path) + ":build", scope["build"]


def test_train_in_torch_finetune_on_the_board_and_back(tmp_path, deployed_flash):
    ds, train, test, mean, std, feats = _iris_split()
    factory, build = _build(tmp_path)
    torch.manual_seed(0)
    tm = build()
    x, y = _xy(train, mean, std)
    opt = torch.optim.Adam(tm.parameters(), lr=1e-2)
    for _ in range(150):
        opt.zero_grad()
        nn.functional.cross_entropy(tm(x), y).backward()
        opt.step()
    tm.eval()
    xt, yt = _xy(test, mean, std)
    torch_acc = float((tm(xt).argmax(1) == yt).float().mean())
    assert torch_acc >= 0.8, torch_acc

    pt = tmp_path / "mine.pt"
    torch.save(tm.state_dict(), pt)
    meta = {"classes": list(ds.classes), "features": feats, "mean": list(mean), "std": list(std),
            "split_seed": SPLIT_SEED, "n_train": 120, "data": "iris.csv", "history": []}
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    ck = tmp_path / "mine.mfck"
    r = subprocess.run([sys.executable, TORCH_IO, str(pt), "--model", factory, "--out", str(ck),
                        "--meta", str(tmp_path / "meta.json")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr

    board = vboard.VirtualBoard(tmp_path / "board", heap="1M")
    deployed_flash(tmp_path / "board", board.micropython)       # deployed before: ck is what changes
    with board as b:
        deploy.deploy(str(b.port), str(ck))
        out = board_link.mpremote(str(b.port), "exec",
                                  "import finetune\n"
                                  "s = finetune.Session(verbose=False)\n"
                                  "print('BEFORE', s.evaluate(verbose=False).accuracy)\n"
                                  "s.fit(epochs=3, data='train', verbose=False)\n"
                                  "print('AFTER', s.evaluate(verbose=False).accuracy)\n"
                                  "s.save()\n", timeout=300)
        before = float(out.split("BEFORE")[1].split()[0])
        board_link.mpremote(str(b.port), "cp", ":model.mfck", str(tmp_path / "tuned.mfck"))
    # the board evaluated torch's weights as torch does
    assert abs(before - torch_acc) <= 1 / 30 + 1e-9, (before, torch_acc)

    back = tmp_path / "tuned.pt"
    r = subprocess.run([sys.executable, TORCH_IO, str(tmp_path / "tuned.mfck"), "--model", factory,
                        "--out", str(back)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    tuned = build().eval()
    tuned.load_state_dict(torch.load(back, weights_only=True), strict=True)
    board_model = mf.load_model(str(tmp_path / "tuned.mfck"))
    # the weights changed on the board (a real fine-tune), and torch now computes what they compute
    assert any(not torch.equal(a, b) for a, b in zip(tm.state_dict().values(), tuned.state_dict().values()))
    want = board_model(mf.Tensor.from_list(xt.tolist())).data
    got = tuned(xt).detach().numpy().ravel()
    assert float(np.abs(got - np.asarray(want)).max()) <= 1e-5 * max(1.0, float(np.abs(got).max()))
