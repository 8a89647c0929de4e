"""Two torch models of shapes the project never shipped, as a user writes them, both ways:
(a) a sequence classifier on [B, L, C] with a TransformerEncoderLayer (pre- and post-norm), and
(b) a Conv1D sensor model on channels-first [B, C, L] (Conv1d, MaxPool1d, Flatten, Linear).
from_torch -> microformer computes what torch computes (python and numpy backends, <= 1e-5, the
input fed as [B, L, C]); the CLI converts a state_dict + the user's model file with a minimal
meta.json; the checkpoint is fine-tuned in microformer, and load_into / the CLI's .mfck -> .pt put
the tuned weights back into the user's own module, which then computes what microformer computes."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import helpers
import microformer as mf
from torch_compare import close, torch
import torch_io  # noqa: E402

TORCH_IO = os.path.join(helpers.TOOLS, "torch_io.py")
C, L, E, K, FILT = 3, 8, 8, 4, 6

# the user's own model file: what --model FILE.py:FACTORY imports
MODELS_PY = '''
import torch_io
from torch import nn


def sequence(norm_first=True):
    return nn.Sequential(nn.Linear({C}, {E}),
                         nn.TransformerEncoderLayer({E}, 2, 2 * {E}, dropout=0.0, batch_first=True,
                                                    norm_first=norm_first),
                         torch_io.GlobalAvgPool(), nn.Linear({E}, {K}))


def sequence_post():
    return sequence(norm_first=False)


def conv():
    return nn.Sequential(nn.Conv1d({C}, {F}, 5, padding=2), nn.ReLU(), nn.MaxPool1d(2), nn.Flatten(),
                         nn.Linear({F} * {L} // 2, {K}))
'''.format(C=C, E=E, K=K, F=FILT, L=L)


def _user_models(tmp_path):
    return helpers.user_module(tmp_path, "mymodels", MODELS_PY)


def _randomize(module, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.rand(p.shape, generator=g) * 0.4 - 0.2)     # LayerNorm / biases away from 1 / 0
    return module.eval()


# (factory, the torch input for a batch, how microformer takes it, the input_shape it says)
CASES = {
    "sequence-prenorm": ("sequence", lambda g: torch.randn(5, L, C, generator=g), lambda x: x, [L, C]),
    "sequence-postnorm": ("sequence_post", lambda g: torch.randn(5, L, C, generator=g), lambda x: x, [L, C]),
    "conv1d-sensor": ("conv", lambda g: torch.randn(5, C, L, generator=g), lambda x: x.transpose(1, 2), [L, C]),
}


def _mf_out(model, x):
    return model(mf.Tensor.from_list(x.tolist()))


@pytest.mark.parametrize("case", sorted(CASES))
def test_from_torch_computes_what_torch_computes(tmp_path, backend, case):
    factory, make_x, to_mf, _ = CASES[case]
    _, mod = _user_models(tmp_path)
    tm = _randomize(getattr(mod, factory)(), 1)
    x = make_x(torch.Generator().manual_seed(2))
    model = torch_io.from_torch(tm)
    close(_mf_out(model, to_mf(x)), tm(x), case)


def _fine_tune(model, x, steps=3):
    """A few Adam steps in microformer: the weights a board would send back."""
    model.train()
    opt = mf.Adam(model.parameters(), lr=0.05)
    loss = mf.CrossEntropyLoss()
    labels = [i % K for i in range(x.shape[0])]
    for _ in range(steps):
        opt.zero_grad()
        loss.forward(model(mf.Tensor.from_list(x.tolist())), labels)
        model.backward(loss.backward())
        opt.step()
    model.eval()
    return model


def _cli(*args):
    return subprocess.run([sys.executable, TORCH_IO] + [str(a) for a in args], capture_output=True, text=True)


@pytest.mark.parametrize("case", sorted(CASES))
def test_cli_minimal_meta_then_back_into_the_users_module(tmp_path, case):
    factory, make_x, to_mf, shape = CASES[case]
    path, mod = _user_models(tmp_path)
    tm = _randomize(getattr(mod, factory)(), 3)
    x = make_x(torch.Generator().manual_seed(4))
    pt = tmp_path / "mine.pt"
    torch.save(tm.state_dict(), pt)
    # the minimal metadata: the class names; the window length comes from --input-shape
    (tmp_path / "meta.json").write_text(json.dumps({"classes": ["rest", "walk", "run", "fall"]}))
    ck = tmp_path / "mine.mfck"
    r = _cli(pt, "--model", "%s:%s" % (path, factory), "--meta", tmp_path / "meta.json",
             "--input-shape", "%d,%d" % tuple(shape), "--out", ck)
    assert r.returncode == 0, r.stderr
    # what was defaulted is said, with what it is for
    for key in ("features: x0..x2", "mean: 0.0 per channel", "std: 1.0 per channel", "split_seed: 0",
                "n_train: 80%"):
        assert "metadata default: " + key in r.stdout, (key, r.stdout)
    if case.startswith("conv"):
        assert "[B, C, L]" in r.stdout and "columns reordered" in r.stdout
    model, meta = mf.load_model(str(ck), with_meta=True)
    assert meta["input_shape"] == shape and meta["classes"] == ["rest", "walk", "run", "fall"]
    assert meta["features"] == ["x0", "x1", "x2"] and meta["std"] == [1.0] * C
    close(_mf_out(model, to_mf(x)), tm(x), case + " from the checkpoint")

    # fine-tune in microformer (as the board would) and save; back into the user's own module
    tuned = _fine_tune(model, to_mf(x))
    tuned_ck = tmp_path / "tuned.mfck"
    mf.checkpoint.save(str(tuned_ck), tuned, dict(meta, spec=mf.to_spec(tuned)))
    want = _mf_out(tuned, to_mf(x))
    # (a real change: the tuned model no longer computes what the torch model it came from does)
    assert float(np.abs(np.asarray(want.data) - tm(x).detach().numpy().ravel()).max()) > 1e-3

    mine = getattr(mod, factory)().eval()
    assert torch_io.load_into(mine, str(tuned_ck)) is mine
    close(mine(x), want, case + " load_into")

    # the CLI's way: a state_dict that loads with weights_only=True into the user's module
    out = tmp_path / "tuned.pt"
    r = _cli(tuned_ck, "--model", "%s:%s" % (path, factory), "--out", out)
    assert r.returncode == 0, r.stderr
    mine2 = getattr(mod, factory)().eval()
    mine2.load_state_dict(torch.load(out, weights_only=True), strict=True)
    close(mine2(x), want, case + " via the CLI")


def test_post_norm_model_runs_in_micropython(tmp_path, micropython):
    # the post-norm EncoderBlock inside MicroPython (portable loops and viper), against torch
    path, mod = _user_models(tmp_path)
    tm = _randomize(mod.sequence_post(), 5)
    ck = tmp_path / "post.mfck"
    mf.checkpoint.save(str(ck), torch_io.from_torch(tm), {"spec": mf.to_spec(torch_io.from_torch(tm))})
    x = torch.randn(2, L, C, generator=torch.Generator().manual_seed(6))
    (tmp_path / "x.json").write_text(json.dumps(x.tolist()))
    for backend, tol in (("python", 1e-5), ("viper", 5e-3)):
        out = json.loads(helpers.run_micropython(helpers.script("load_model_mp.py"), str(ck),
                                                 str(tmp_path / "x.json"), backend, exe=micropython))
        close(np.asarray(out["y"]).reshape(out["shape"]), tm(x), "MicroPython " + backend, tol)
