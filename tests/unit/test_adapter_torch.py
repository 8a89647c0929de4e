"""host/tools/torch_io.apply_adapter: an adapter file trained in microformer merged into the torch model
of its base (one add per adapter, q/k/v into in_proj_weight rows, trained plain tensors copied)
equals microformer's merged model within 1e-5, weights and outputs."""
import numpy as np
import pytest
import torch

import microformer as mf
from microformer import checkpoint as ck
from microformer import lora as L

import torch_io


def _model():
    mf.seed(6)
    return mf.Sequential([mf.Dense(4, 16), mf.Reshape((2, 8)), mf.EncoderBlock(8, 2, 12),
                          mf.GlobalAvgPool(), mf.Dense(8, 3)])


def _fill(t, seed, scale):
    rng = np.random.default_rng(seed)
    for i, v in enumerate(rng.uniform(-scale, scale, t.size)):
        t.data[i] = float(v)


@pytest.mark.parametrize("head", [False, True], ids=["adapters", "adapters+head"])
def test_apply_adapter_equals_the_merged_model(tmp_path, head):
    model = _model()
    base = str(tmp_path / "base.mfck")
    mf.save_checkpoint(base, model)
    module = torch_io.to_torch(mf.load_model(base))
    L.add_lora(model, rank=2, alpha=4, targets=("attention", "ffn"))
    L.add_lora(model, rank=3, alpha=5, targets=("0",))
    for i, (_, a) in enumerate(L.adapters(model)):
        _fill(a.B, 10 + i, 0.5)
    if head:
        model[-1].trainable = True
        _fill(model[-1].W, 99, 0.7)
    apath = str(tmp_path / "a.mfck")
    ck.save_adapter(apath, model, base)
    torch_io.apply_adapter(module, apath)
    L.merge_lora(model)
    want = {k: np.array(v.tolist()) for k, v in model.state_dict().items()}
    got = {k: v.detach().numpy() for k, v in module.state_dict().items()}
    assert sorted(got) == sorted(want)
    for k in want:
        assert float(np.max(np.abs(got[k] - want[k]))) <= 1e-5, k
    x = np.random.default_rng(3).uniform(-1, 1, (5, 4))
    y = model.forward(mf.Tensor.from_list(x.tolist()))
    with torch.no_grad():
        ty = module(torch.tensor(x, dtype=torch.float32)).numpy()
    assert float(np.max(np.abs(np.array(y.data).reshape(ty.shape) - ty))) <= 1e-5


def test_apply_adapter_refuses_a_full_checkpoint(tmp_path):
    model = _model()
    base = str(tmp_path / "base.mfck")
    mf.save_checkpoint(base, model)
    with pytest.raises(ValueError, match="not an adapter file"):
        torch_io.apply_adapter(torch_io.to_torch(model), base)
