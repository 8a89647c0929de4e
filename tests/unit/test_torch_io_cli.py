"""host/tools/torch_io.py on the command line, given files it must not trust: nothing from a .pt runs
without --trust (a crafted pickle that would write a marker file never does), whole pickled
modules need --trust, corrupt / empty files and broken metadata give one line naming the file,
and the metadata is checked with microformer.meta (errors refused with key, expected and got;
defaults said; input_shape filled from the model when it can be, asked for when it cannot)."""
import contextlib
import io
import json
import os
import pickle
import subprocess
import sys

import pytest

import helpers
import microformer as mf
from torch_compare import torch
import torch_io  # noqa: E402
from torch import nn  # noqa: E402

TORCH_IO = os.path.join(helpers.TOOLS, "torch_io.py")

MODELS_PY = '''
import torch_io
from torch import nn


def flat():
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def conv():
    return nn.Sequential(nn.Conv1d(2, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6, 3))


def sequence():
    return nn.Sequential(nn.Linear(2, 8), nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True),
                         torch_io.GlobalAvgPool(), nn.Linear(8, 3))


def not_a_module():
    return 42
'''
CLASSES = ["a", "b", "c"]


def _cli_process(*args):
    """host/tools/torch_io.py as a user runs it: a process of its own."""
    return subprocess.run([sys.executable, TORCH_IO] + [str(a) for a in args], capture_output=True, text=True)


def _cli(*args):
    """torch_io.main() in this process (a torch import per case would take seconds), with what the
    process would give: exit status 1 and the SystemExit's text on stderr, or 0 and stdout; any
    other exception (a traceback a user would see) fails the test here."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            torch_io.main([str(a) for a in args])
        except SystemExit as e:
            if isinstance(e.code, str):
                print(e.code, file=sys.stderr)
                code = 1
            else:
                code = e.code or 0
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def _one_line(r, *words):
    """A refusal: exit status 1, one line on stderr holding the words, no traceback."""
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    err = r.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    for w in words:
        assert str(w) in err, (w, err)
    return err


@pytest.fixture
def files(tmp_path):
    (tmp_path / "mymodels.py").write_text(MODELS_PY)
    torch.manual_seed(0)
    sd = {}
    for name, m in (("flat", nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))),
                    ("conv", nn.Sequential(nn.Conv1d(2, 4, 3, padding=1), nn.ReLU(), nn.Flatten(),
                                           nn.Linear(4 * 6, 3))),
                    ("sequence", nn.Sequential(nn.Linear(2, 8),
                                               nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True),
                                               torch_io.GlobalAvgPool(), nn.Linear(8, 3)))):
        sd[name] = tmp_path / (name + ".pt")
        torch.save(m.state_dict(), sd[name])
    return tmp_path, sd


def _model(tmp, name):
    return "%s:%s" % (tmp / "mymodels.py", name)


def _meta(tmp, obj, name="meta.json"):
    p = tmp / name
    p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return p


# ---- nothing from a file runs --------------------------------------------------------------

class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (exec, ("open(%r, 'w').write('ran')" % self.marker,))


@pytest.mark.parametrize("how", ["torch.save", "pickle.dump"])
def test_a_crafted_pickle_never_runs_without_trust(tmp_path, how):
    marker = tmp_path / "marker"
    evil = tmp_path / "evil.pt"
    payload = {"0.weight": torch.zeros(3, 4), "x": _Evil(str(marker))}
    if how == "torch.save":
        torch.save(payload, evil)
    else:
        with open(evil, "wb") as f:
            pickle.dump(payload, f)
    err = _one_line(_cli_process(evil, "--out", tmp_path / "x.mfck"), evil, "nothing from it was run", "--trust")
    assert "runs code" in err
    assert not marker.exists()
    assert not (tmp_path / "x.mfck").exists()
    # the file is what it claims: with --trust (the user's explicit word) its code runs
    r = _cli_process(evil, "--out", tmp_path / "x.mfck", "--trust")
    assert marker.read_text() == "ran"
    assert "--trust: loading %s runs code from it" % evil in r.stdout
    # (then the file is refused all the same: not a state_dict, or, a plain pickle, not a torch file)
    _one_line(r, *(["holds a dict", "not a state_dict"] if how == "torch.save" else ["not a readable torch file"]))


def test_whole_modules_need_trust(tmp_path):
    torch.manual_seed(1)
    tm = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)).eval()
    pt = tmp_path / "whole.pt"
    torch.save(tm, pt)
    _one_line(_cli(pt, "--out", tmp_path / "x.mfck"), pt, "whole module", "module.state_dict()",
              "--model FILE.py:FACTORY", "--trust (runs code from it)")
    r = _cli(pt, "--out", tmp_path / "x.mfck", "--trust")
    assert r.returncode == 0, r.stderr
    x = torch.randn(2, 4)
    got = mf.load_model(str(tmp_path / "x.mfck"))(mf.Tensor.from_list(x.tolist()))
    assert list(got.shape) == [2, 3]
    assert max(abs(a - b) for a, b in zip(got.data, tm(x).detach().reshape(-1).tolist())) <= 1e-5


def test_the_help_says_trust_runs_code():
    r = _cli_process("--help")
    assert "--trust" in r.stdout and "RUNS CODE" in " ".join(r.stdout.split())


def test_mfck_to_pt_writes_a_state_dict_that_loads_weights_only(files):
    tmp, sd = files
    ck = tmp / "flat.mfck"
    assert _cli(sd["flat"], "--model", _model(tmp, "flat"), "--out", ck).returncode == 0
    out = tmp / "back.pt"
    r = _cli(ck, "--out", out)
    assert r.returncode == 0, r.stderr
    assert "torch_io.to_torch" in r.stdout
    back = torch.load(out, weights_only=True)
    module = torch_io.to_torch(mf.load_model(str(ck)))
    module.load_state_dict(back, strict=True)
    assert all(torch.equal(back[k], v) for k, v in torch.load(sd["flat"], weights_only=True).items())


# ---- files that are not what they should be: one line naming the file ------------------------

@pytest.mark.parametrize("content", [b"", b"PK\x03\x04 not really a zip", b"\x80\x04garbage"],
                         ids=["empty", "corrupt-zip", "corrupt-pickle"])
def test_corrupt_or_empty_pt(tmp_path, content):
    pt = tmp_path / "bad.pt"
    pt.write_bytes(content)
    _one_line(_cli_process(pt, "--out", tmp_path / "x.mfck"), pt, "not a readable torch file")
    assert not (tmp_path / "x.mfck").exists()


def test_missing_pt_and_corrupt_checkpoint(tmp_path):
    _one_line(_cli(tmp_path / "nope.pt", "--out", tmp_path / "x.mfck"), tmp_path / "nope.pt", "no such file")
    ck = tmp_path / "bad.mfck"
    ck.write_bytes(b"MFCK" + b"\x00" * 40)
    _one_line(_cli(ck, "--out", tmp_path / "x.pt"), ck, "cannot open it as a checkpoint")
    assert not (tmp_path / "x.pt").exists()


@pytest.mark.parametrize("text,words", [
    ('{"classes": ["a", "b", "c"],', ["not valid JSON", "line 1"]),
    ("[1, 2]", ["metadata must be a JSON object (dict), got list"]),
    ("null", ["metadata must be a JSON object (dict), got NoneType"]),
    ('{"classes": ["a", "b", "c"], "std": [1, 0, 1, 1]}', ["metadata 'std' must be a list of numbers > 0",
                                                           "divide by zero", "[1, 0, 1, 1]"]),
    ('{"classes": ["a", "b"]}', ["metadata 'classes' names 2 outputs, the model gives [3]"]),
    ('{"mean": [0, 0, 0, 0]}', ["lacks 'classes'"]),
    ('{"classes": ["a", "b", "c"], "input_shape": [5]}', ["input_shape [5] does not fit the model",
                                                          "Dense", "4"]),
    ('{"classes": ["a", "b", "c"], "input_shape": "4"}', ["input_shape must be [F] or [L, C]", "'4'"]),
])
def test_bad_metadata_is_refused_in_one_line(files, text, words):
    tmp, sd = files
    meta = _meta(tmp, text)
    _one_line(_cli(sd["flat"], "--model", _model(tmp, "flat"), "--meta", meta, "--out", tmp / "x.mfck"),
              "--meta %s" % meta, *words)
    assert not (tmp / "x.mfck").exists()


def test_missing_meta_file(files):
    tmp, sd = files
    _one_line(_cli(sd["flat"], "--model", _model(tmp, "flat"), "--meta", tmp / "none.json", "--out", tmp / "x.mfck"),
              "--meta %s" % (tmp / "none.json"), "cannot read it")


# ---- input_shape: from the model when it can say, else asked for --------------------------------

def test_flat_input_shape_comes_from_the_first_linear(files):
    tmp, sd = files
    r = _cli(sd["flat"], "--model", _model(tmp, "flat"), "--meta", _meta(tmp, {"classes": CLASSES}),
             "--out", tmp / "x.mfck")
    assert r.returncode == 0, r.stderr
    assert "metadata: input_shape: [4] (flat features: the first Linear's in_features)" in r.stdout
    meta = mf.checkpoint.read_header(str(tmp / "x.mfck"))["meta"]
    assert meta["input_shape"] == [4] and meta["mean"] == [0.0] * 4 and meta["classes"] == CLASSES


@pytest.mark.parametrize("name,C", [("conv", 2), ("sequence", 2)])
def test_a_window_length_is_asked_for(files, name, C):
    tmp, sd = files
    meta = _meta(tmp, {"classes": CLASSES})
    _one_line(_cli(sd[name], "--model", _model(tmp, name), "--meta", meta, "--out", tmp / "x.mfck"),
              "--meta %s" % meta, "--input-shape L,%d" % C)
    assert not (tmp / "x.mfck").exists()
    # given by --input-shape, or in the metadata; checked against the model
    r = _cli(sd[name], "--model", _model(tmp, name), "--meta", meta, "--input-shape", "6,%d" % C,
             "--out", tmp / "x.mfck")
    assert r.returncode == 0, r.stderr
    assert mf.checkpoint.read_header(str(tmp / "x.mfck"))["meta"]["input_shape"] == [6, C]
    meta2 = _meta(tmp, {"classes": CLASSES, "input_shape": [6, C]}, "meta2.json")
    r = _cli(sd[name], "--model", _model(tmp, name), "--meta", meta2, "--out", tmp / "y.mfck")
    assert r.returncode == 0, r.stderr
    _one_line(_cli(sd[name], "--model", _model(tmp, name), "--meta", meta2, "--input-shape", "7,%d" % C,
                   "--out", tmp / "z.mfck"), "--input-shape 7,%d" % C, "differ")
    _one_line(_cli(sd[name], "--model", _model(tmp, name), "--meta", meta, "--input-shape", "6,%d" % (C + 1),
                   "--out", tmp / "z.mfck"), "input_shape [6, %d] does not fit the model" % (C + 1))
    _one_line(_cli(sd[name], "--model", _model(tmp, name), "--input-shape", "6,x", "--out", tmp / "z.mfck"),
              "--input-shape must be F", "'6,x'")


def test_without_meta_it_says_what_the_session_lacks(files):
    tmp, sd = files
    r = _cli(sd["conv"], "--model", _model(tmp, "conv"), "--out", tmp / "x.mfck")
    assert r.returncode == 0, r.stderr
    assert "no --meta: finetune.Session cannot open this checkpoint" in r.stdout
    assert "--input-shape L,2" in r.stdout
    assert mf.load_model(str(tmp / "x.mfck")) is not None


# ---- --model FILE.py:FACTORY ------------------------------------------------------------------

def test_model_factory_errors(files):
    tmp, sd = files
    out = tmp / "x.mfck"
    _one_line(_cli(sd["flat"], "--model", "mymodels.py", "--out", out), "--model must be FILE.py:FACTORY")
    _one_line(_cli(sd["flat"], "--model", str(tmp / "none.py") + ":f", "--out", out), "none.py: no such file")
    _one_line(_cli(sd["flat"], "--model", _model(tmp, "nope"), "--out", out), "has no function or class 'nope'",
              "conv, flat")
    _one_line(_cli(sd["flat"], "--model", _model(tmp, "not_a_module"), "--out", out),
              "not_a_module() returned a int, not a torch.nn.Module")
    _one_line(_cli(sd["flat"], "--model", _model(tmp, "conv"), "--out", out), sd["flat"],
              "does not fit the module --model", "Missing key")
    ck = tmp / "flat.mfck"
    assert _cli(sd["flat"], "--model", _model(tmp, "flat"), "--out", ck).returncode == 0
    _one_line(_cli(ck, "--model", _model(tmp, "conv"), "--out", tmp / "x.pt"), ck, "does not fit the module")
    assert not out.exists() and not (tmp / "x.pt").exists()
