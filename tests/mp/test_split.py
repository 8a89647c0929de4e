"""The split belongs to the model: the checkpoint's metadata names the base data's test rows
('split'), the board never reshuffles them, and host/tools/torch_io.py --meta stores the user's own
split. tests/mp/split_mp.py holds the session's checks (CPython and both MicroPython ports)."""
import json
import os
import subprocess
import sys

import pytest

import helpers
import split_mp


def test_split_cpython(tmp_path):
    split_mp.check(split_mp.run(str(tmp_path)))


def test_split_micropython(tmp_path, micropython):
    out = helpers.run_micropython(helpers.script("split_mp.py"), str(tmp_path), heap="1M", exe=micropython)
    assert "SPLIT OK" in out, out


def test_none_given_is_said_once(tmp_path, capsys):
    import finetune
    split_mp.write_flash(str(tmp_path))
    s = finetune.Session(root=str(tmp_path), verbose=True)
    out = capsys.readouterr().out
    assert out.count("note: split: the checkpoint gives none") == 1, out
    s.save()
    capsys.readouterr()
    finetune.Session(root=str(tmp_path), verbose=True)
    assert "note: split" not in capsys.readouterr().out


def test_torch_io_meta_keeps_the_users_split(tmp_path):
    torch = pytest.importorskip("torch")
    from torch import nn
    import microformer as mf
    (tmp_path / "m.py").write_text("from torch import nn\n\ndef build():\n"
                                   "    return nn.Sequential(nn.Linear(2, 4), nn.ReLU(), nn.Linear(4, 2))\n")
    torch.manual_seed(0)
    torch.save(nn.Sequential(nn.Linear(2, 4), nn.ReLU(), nn.Linear(4, 2)).state_dict(), tmp_path / "m.pt")
    test_rows = [29, 3, 17, 8, 11, 0]
    (tmp_path / "meta.json").write_text(json.dumps({"classes": split_mp.CLASSES, "features": ["a", "b"],
                                                    "data": "pts.csv", "split": {"test": test_rows}}))
    r = subprocess.run([sys.executable, os.path.join(helpers.TOOLS, "torch_io.py"), str(tmp_path / "m.pt"),
                        "--model", "%s:build" % (tmp_path / "m.py"), "--meta", str(tmp_path / "meta.json"),
                        "--out", str(tmp_path / "model.mfck")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert mf.checkpoint.read_header(str(tmp_path / "model.mfck"))["meta"]["split"] == {"test": test_rows}
    # on the board: the test split is exactly the user's hold-out, no training row in it
    import finetune
    os.makedirs(str(tmp_path / "data"), exist_ok=True)
    with open(str(tmp_path / "data" / "pts.csv"), "w") as f:
        f.write("a,b,label\n" + "".join("%d,%d,%s\n" % (i, i % 3, split_mp.CLASSES[i % 2]) for i in range(30)))
    s = finetune.Session(root=str(tmp_path), verbose=False)
    assert split_mp.rows_of(s, "test") == sorted(test_rows)
    assert not set(split_mp.rows_of(s, "train")) & set(test_rows)
