"""host/tools/torch_io.py: torch modules <-> microformer models, torch files <-> checkpoints that
mf.load_model opens inside MicroPython."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import helpers
import microformer as mf

torch = pytest.importorskip("torch") if not os.environ.get("CI") else __import__("torch")
import torch_io  # noqa: E402
from torch import nn  # noqa: E402

TORCH_IO = os.path.join(helpers.TOOLS, "torch_io.py")


def _rel(a, b):
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.abs(a - b).max()) / max(float(np.abs(b).max()), 1e-12)


def _token_model(seed=0, dropout=0.0, activation="gelu"):
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Embedding(13, 8), torch_io.PositionalEncoding(16, 8),
                      nn.TransformerEncoderLayer(8, 2, 16, dropout=dropout, activation=activation,
                                                 batch_first=True, norm_first=True),
                      nn.LayerNorm(8), nn.Linear(8, 13))
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.rand(p.shape) * 0.2 - 0.1)      # LayerNorm and biases away from 1 / 0
    return m.eval()


IDS = [[1, 5, 7, 2, 0, 12], [3, 3, 9, 11, 4, 6]]


@pytest.mark.parametrize("activation,kind", [("gelu", "gelu"), ("relu", "relu"),
                                             (nn.GELU("tanh"), "gelu_tanh")], ids=["gelu", "relu", "gelu_tanh"])
def test_from_torch_token_model(activation, kind):
    tm = _token_model(activation=activation)
    model = torch_io.from_torch(tm)
    assert model.layers[2].ffn.kind == kind
    assert [type(l).__name__ for l in model.layers] == ["Embedding", "PositionalEncoding", "EncoderBlock",
                                                         "LayerNorm", "Dense"]
    want = tm(torch.tensor(IDS)).detach().numpy()
    got = model(mf.Tensor.from_list(IDS))
    assert got.shape == want.shape
    assert _rel(got.data, want) <= 1e-5


def _iris():
    from microformer.models import iris_model
    return iris_model(1)


def test_to_torch_and_back():
    # the shipped Iris model: Attention directly in the Sequential becomes torch_io.SelfAttention,
    # nn.MultiheadAttention's parameters and names with forward(x): the whole module runs in torch
    model = _iris()
    to = torch_io.to_torch(model)
    assert isinstance(to, nn.Sequential) and isinstance(to[3], torch_io.SelfAttention)
    assert list(to.state_dict()) == list(model.state_dict())
    assert "3.in_proj_weight" in to.state_dict() and "3.out_proj.weight" in to.state_dict()
    x = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    want = model(mf.Tensor.from_list(x.tolist())).data
    got = to(torch.tensor(x)).detach().numpy()
    assert got.shape == (5, 3)
    assert _rel(got, want) <= 1e-5
    back = torch_io.from_torch(to)
    assert {k: list(v.data) for k, v in back.state_dict().items()} == \
        {k: list(v.data) for k, v in model.state_dict().items()}
    assert mf.to_spec(back) == mf.to_spec(model)


def test_to_torch_causal_self_attention():
    mf.seed(4)
    model = mf.Sequential([mf.Dense(3, 8), mf.Attention(8, 2, causal=True), mf.Dense(8, 2)])
    to = torch_io.to_torch(model)
    x = np.random.default_rng(1).normal(size=(2, 5, 3)).astype(np.float32)
    want = model(mf.Tensor.from_list(x.tolist())).data
    assert _rel(to(torch.tensor(x)).detach().numpy(), want) <= 1e-5
    # without the mask the outputs differ: the test sees causality
    to[1].causal = False
    assert _rel(to(torch.tensor(x)).detach().numpy(), want) > 1e-3
    to[1].causal = True
    assert mf.to_spec(torch_io.from_torch(to)) == mf.to_spec(model)


def test_unsupported_modules_are_named():
    with pytest.raises(ValueError, match=r"Sequential\[1\] \(Conv2d\): no microformer layer for it \(supported: "
                                         r"Linear, .*Conv1d"):
        torch_io.from_torch(nn.Sequential(nn.Linear(4, 4), nn.Conv2d(4, 4, 3)))
    with pytest.raises(ValueError, match=r"TransformerDecoderLayer\): needs norm_first=True"):
        torch_io.from_torch(nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, batch_first=True))
    odd = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.1, batch_first=True, norm_first=True)
    odd.dropout2.p = 0.3
    with pytest.raises(ValueError, match=r"dropouts differ \(dropout=0.1, dropout1=0.1, dropout2=0.3"):
        torch_io.from_torch(odd)
    assert torch_io.from_torch(_token_model(dropout=0.1))[2].dropout == pytest.approx(0.1)
    assert torch_io.from_torch(_token_model(dropout=0.1), ignore_dropout=True)[2].dropout == 0.0


TOKEN_MODEL_PY = """
import torch_io
from torch import nn


def build():
    return nn.Sequential(nn.Embedding(13, 8), torch_io.PositionalEncoding(16, 8),
                         nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, activation="gelu", batch_first=True,
                                                    norm_first=True),
                         nn.LayerNorm(8), nn.Linear(8, 13))
"""


def _cli(*args):
    return subprocess.run([sys.executable, TORCH_IO] + [str(a) for a in args], capture_output=True, text=True)


def test_cli_to_checkpoint_loads_in_micropython(tmp_path, micropython):
    tm = _token_model(seed=3)
    pt = tmp_path / "model.pt"
    torch.save(tm.state_dict(), pt)
    (tmp_path / "tokens.py").write_text(TOKEN_MODEL_PY)
    ck = tmp_path / "model.mfck"
    meta = tmp_path / "meta.json"
    meta.write_text(json.dumps({"vocab": "abc"}))
    r = _cli(pt, "--model", str(tmp_path / "tokens.py") + ":build", "--out", ck, "--meta", meta)
    assert r.returncode == 0, r.stderr
    assert "Embedding -> PositionalEncoding -> EncoderBlock -> LayerNorm -> Dense" in r.stdout
    assert "not checked (the model takes token ids" in r.stdout
    x = tmp_path / "ids.json"
    x.write_text(json.dumps(IDS))
    want = tm(torch.tensor(IDS)).detach().numpy()
    for backend, tol in (("python", 1e-5), ("viper", 5e-3)):
        out = json.loads(helpers.run_micropython(helpers.script("load_model_mp.py"), str(ck),
                                                 str(x), backend, exe=micropython))
        assert out["shape"] == list(want.shape)
        assert _rel(out["y"], want) <= tol, backend
    # the user's meta travels with it
    assert mf.checkpoint.read_header(str(ck))["meta"]["vocab"] == "abc"
    # and back to a torch file: a state_dict that loads with weights_only=True into the user's module
    pt2 = tmp_path / "back.pt"
    r = _cli(ck, "--model", str(tmp_path / "tokens.py") + ":build", "--out", pt2)
    assert r.returncode == 0, r.stderr
    back = _token_model(seed=9)
    back.load_state_dict(torch.load(pt2, weights_only=True))
    assert _rel(back(torch.tensor(IDS)).detach().numpy(), want) <= 1e-5


def test_cli_refuses_to_overwrite_and_asks_for_the_architecture(tmp_path):
    pt = tmp_path / "sd.pt"
    torch.save(nn.Linear(2, 2).state_dict(), pt)
    out = tmp_path / "x.mfck"
    r = _cli(pt, "--out", out)
    assert r.returncode != 0 and "holds a state_dict (2 tensors)" in r.stderr and "--model FILE.py:FACTORY" in r.stderr
    assert not out.exists()
    out.write_text("mine")
    r = _cli(pt, "--out", out)
    assert r.returncode != 0 and "exists" in r.stderr
    assert out.read_text() == "mine"
