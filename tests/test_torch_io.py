"""host/torch_io.py: torch modules <-> microformer models, torch files <-> checkpoints that
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

TORCH_IO = os.path.join(helpers.HOST, "torch_io.py")


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
    mf.seed(1)
    return mf.Sequential([mf.Dense(4, 32), mf.ActivationLayer("relu"), mf.Reshape((4, 8)),
                          mf.Attention(8, 2), mf.GlobalAvgPool(), mf.Dense(8, 3)])


def test_to_torch_and_back():
    model = _iris()
    tm = to = torch_io.to_torch(model)
    assert isinstance(to, nn.Sequential) and isinstance(to[3], nn.MultiheadAttention)
    x = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    want = model(mf.Tensor.from_list(x.tolist())).data
    # the torch module runs the same computation (MultiheadAttention needs q, k, v)
    h = to[2](to[1](to[0](torch.tensor(x))))
    h = to[3](h, h, h, need_weights=False)[0]
    got = to[5](to[4](h)).detach().numpy()
    assert _rel(got, want) <= 1e-5
    back = torch_io.from_torch(tm)
    assert {k: list(v.data) for k, v in back.state_dict().items()} == \
        {k: list(v.data) for k, v in model.state_dict().items()}


def test_unsupported_modules_are_named():
    with pytest.raises(ValueError, match=r"Sequential\[1\] \(Conv2d\): no microformer layer"):
        torch_io.from_torch(nn.Sequential(nn.Linear(4, 4), nn.Conv2d(4, 4, 3)))
    with pytest.raises(ValueError, match="norm_first=True"):
        torch_io.from_torch(nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True))
    odd = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.1, batch_first=True, norm_first=True)
    odd.dropout2.p = 0.3
    with pytest.raises(ValueError, match=r"dropouts differ \(dropout=0.1, dropout1=0.1, dropout2=0.3"):
        torch_io.from_torch(odd)
    assert torch_io.from_torch(_token_model(dropout=0.1))[2].dropout == pytest.approx(0.1)
    assert torch_io.from_torch(_token_model(dropout=0.1), ignore_dropout=True)[2].dropout == 0.0


def test_cli_to_checkpoint_loads_in_micropython(tmp_path, micropython):
    tm = _token_model(seed=3)
    pt = tmp_path / "model.pt"
    torch.save(tm, pt)
    ck = tmp_path / "model.mfck"
    meta = tmp_path / "meta.json"
    meta.write_text(json.dumps({"vocab": "abc"}))
    r = subprocess.run([sys.executable, TORCH_IO, str(pt), "--out", str(ck), "--meta", str(meta)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "Embedding -> PositionalEncoding -> EncoderBlock -> LayerNorm -> Dense" in r.stdout
    x = tmp_path / "ids.json"
    x.write_text(json.dumps(IDS))
    want = tm(torch.tensor(IDS)).detach().numpy()
    for backend, tol in (("python", 1e-5), ("viper", 5e-3)):
        out = json.loads(helpers.run_micropython(os.path.join(helpers.TESTS, "mp_load_model.py"), str(ck),
                                                 str(x), backend, exe=micropython))
        assert out["shape"] == list(want.shape)
        assert _rel(out["y"], want) <= tol, backend
    # the user's meta travels with it
    assert mf.checkpoint.read_header(str(ck))["meta"]["vocab"] == "abc"
    # and back to a torch file
    pt2 = tmp_path / "back.pt"
    r = subprocess.run([sys.executable, TORCH_IO, str(ck), "--out", str(pt2)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    back = torch.load(pt2, weights_only=False).eval()
    assert _rel(back(torch.tensor(IDS)).detach().numpy(), want) <= 1e-5


def test_cli_refuses_to_overwrite_and_state_dicts(tmp_path):
    pt = tmp_path / "sd.pt"
    torch.save(nn.Linear(2, 2).state_dict(), pt)
    out = tmp_path / "x.mfck"
    r = subprocess.run([sys.executable, TORCH_IO, str(pt), "--out", str(out)], capture_output=True, text=True)
    assert r.returncode != 0 and "not a module" in r.stderr and "torch.save(module, path)" in r.stderr
    out.write_text("mine")
    torch.save(nn.Linear(2, 2), pt)
    r = subprocess.run([sys.executable, TORCH_IO, str(pt), "--out", str(out)], capture_output=True, text=True)
    assert r.returncode != 0 and "exists" in r.stderr
    assert out.read_text() == "mine"
