"""from_torch on channels-first modules (nn.Conv1d / pools on [B, C, L], nn.Flatten, nn.Linear):
what converts (and computes what torch computes, fed [B, L, C]) and what is refused, with the
module's place in the tree and what would work instead; load_into refusing a module that does not
fit the checkpoint; to_torch of a converted conv model running in torch on [B, L, C]."""
import pytest

import helpers  # noqa: F401  (paths)
import microformer as mf
from torch_compare import close, torch
import torch_io  # noqa: E402
from torch import nn  # noqa: E402


def _rand(module, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.rand(p.shape, generator=g) - 0.5)
    return module.eval()


def _check(tm, C, L, what):
    x = torch.randn(3, C, L, generator=torch.Generator().manual_seed(1))
    model = torch_io.from_torch(tm)
    close(model(mf.Tensor.from_list(x.transpose(1, 2).tolist())), tm(x), what)
    return model


@pytest.mark.parametrize("name,build,C,L", [
    ("stride-dilation-avgpool", lambda: nn.Sequential(
        nn.Conv1d(2, 4, 3, stride=2, padding=1, dilation=2), nn.GELU(), nn.AvgPool1d(3, 1, 1),
        nn.Conv1d(4, 5, 1), nn.Flatten(), nn.Dropout(0.0), nn.Tanh(), nn.Linear(5 * 5, 3)), 2, 11),
    ("pool-first", lambda: nn.Sequential(
        nn.MaxPool1d(2), nn.Conv1d(3, 4, 3, groups=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6, 2)), 3, 16),
    ("adaptive-avg", lambda: nn.Sequential(
        nn.Conv1d(3, 6, 5, padding=2), nn.ReLU(), nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(6, 4)), 3, 9),
    ("nested-and-depthwise", lambda: nn.Sequential(
        nn.Sequential(nn.Conv1d(4, 8, 3, groups=4), nn.ReLU()), nn.Flatten(),
        nn.Sequential(nn.Linear(8 * 5, 6), nn.ReLU(), nn.Linear(6, 2))), 4, 7),
])
def test_channels_first_models_compute_what_torch_computes(backend, name, build, C, L):
    tm = _rand(build())
    model = _check(tm, C, L, name)
    # and back: the user's module takes the weights again, to_torch's runs on [B, L, C]
    mine = build().eval()
    torch_io.load_into(mine, model)
    x = torch.randn(2, C, L, generator=torch.Generator().manual_seed(5))
    close(mine(x), tm(x), name + " load_into")
    close(torch_io.to_torch(model).eval()(x.transpose(1, 2)), tm(x), name + " to_torch")


def test_flatten_after_channels_last_layers_keeps_the_order(backend):
    # [B, S, E] flattens to s*E + e on both sides: no reordering
    L = 5
    tm = _rand(nn.Sequential(nn.Linear(3, 8), nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True),
                             nn.Flatten(), nn.ReLU(), nn.Linear(8 * L, 2)))
    x = torch.randn(2, L, 3, generator=torch.Generator().manual_seed(3))
    close(torch_io.from_torch(tm)(mf.Tensor.from_list(x.tolist())), tm(x), "Flatten after an encoder")


def test_the_input_channels_are_known_after_a_leading_pool():
    c = torch_io._Conversion(nn.Sequential(nn.MaxPool1d(2), nn.Conv1d(3, 4, 3), nn.Flatten(), nn.Linear(8, 2)), False)
    assert c.channels_first and c.in_channels == 3 and c.perms == {"3.weight": (4, 2)}


@pytest.mark.parametrize("build,words", [
    (lambda: nn.Sequential(nn.Conv1d(3, 4, 3), nn.Linear(6, 2)),
     [r"Sequential[1] (Linear)", "L axis of [B, C, L]", "nn.Flatten() before it"]),
    (lambda: nn.Sequential(nn.Linear(3, 8), nn.Conv1d(8, 4, 3)),
     [r"Sequential[1] (Conv1d)", "takes [B, C, L]", "its input here is flat or channels-last",
      "must take the model's input or follow another one"]),
    (lambda: nn.Sequential(nn.Conv1d(3, 4, 3), nn.ReLU()),
     ["Sequential (Sequential)", "its output is [B, C, L] in torch", "nn.Flatten + nn.Linear"]),
    (lambda: nn.Sequential(nn.Conv1d(3, 4, 3), nn.Flatten()),
     [r"Sequential[1] (Flatten)", "must be followed by an nn.Linear"]),
    (lambda: nn.Sequential(nn.Conv1d(3, 4, 3), nn.LayerNorm(4)),
     [r"Sequential[1] (LayerNorm)", "its input here is [B, C, L]",
      "only Conv1d / MaxPool1d / AvgPool1d / AdaptiveAvgPool1d(1) / nn.Flatten may follow there"]),
    (lambda: nn.Sequential(nn.Conv1d(3, 4, 3), torch_io.GlobalAvgPool(), nn.Linear(4, 2)),
     [r"Sequential[1] (GlobalAvgPool)", "its input here is [B, C, L]"]),
    (lambda: nn.Sequential(nn.Conv1d(3, 4, 3), nn.Conv1d(5, 4, 3)),
     [r"Sequential[1] (Conv1d)", "in_channels=5, but its input has 4 channels"]),
    (lambda: nn.Sequential(nn.Conv1d(3, 4, 3), nn.AdaptiveMaxPool1d(1)),
     [r"Sequential[1] (AdaptiveMaxPool1d)", "only AdaptiveAvgPool1d(1)"]),
    (lambda: nn.Sequential(nn.Conv1d(3, 4, 3), nn.AdaptiveAvgPool1d(1), nn.Linear(1, 2)),
     [r"Sequential[2] (Linear)", "[B, C, 1]", "only nn.Flatten may follow there"]),
    (lambda: nn.Sequential(nn.Conv1d(3, 4, 3), nn.Flatten(), nn.LayerNorm(8)),
     [r"Sequential[1] (Flatten)", "must be followed by an nn.Linear"]),
    (lambda: nn.Sequential(nn.Conv1d(3, 4, 3), nn.Flatten(start_dim=2), nn.Linear(6, 2)),
     [r"Sequential[1] (Flatten)", "start_dim=1, end_dim=-1", "got start_dim=2"]),
    (lambda: nn.Sequential(nn.Conv1d(3, 4, 3), nn.Flatten(), nn.Linear(10, 2)),
     [r"Sequential[1] (Flatten)", "in_features=10 is not a multiple of the 4"]),
    (lambda: nn.Sequential(nn.MaxPool1d(2), nn.Flatten(), nn.Linear(8, 2)),
     [r"Sequential[1] (Flatten)", "channel count C is unknown"]),
    (lambda: nn.Sequential(nn.Conv1d(3, 4, 3, padding="same"), nn.Flatten(), nn.Linear(8, 2)),
     [r"Sequential[0] (Conv1d)", "padding='same'"]),
    (lambda: nn.Sequential(nn.Linear(4, 4), nn.Conv2d(4, 4, 3)),
     [r"Sequential[1] (Conv2d)", "no microformer layer for it", "Conv1d / MaxPool1d / AvgPool1d"]),
])
def test_what_cannot_convert_is_named(build, words):
    with pytest.raises(ValueError) as e:
        torch_io.from_torch(build())
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_load_into_refuses_another_architecture_and_leaves_the_module_alone():
    tm = _rand(nn.Sequential(nn.Conv1d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6, 2)))
    model = torch_io.from_torch(tm)
    other = nn.Sequential(nn.Conv1d(3, 4, 5), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4, 2))
    before = {k: v.clone() for k, v in other.state_dict().items()}
    with pytest.raises(ValueError, match=r"load_into: the model does not fit the torch module: "
                                         r"spec.layers\[0\].kernel_size: 3 in the model, 5 in the torch module"):
        torch_io.load_into(other, model)
    assert all(torch.equal(before[k], v) for k, v in other.state_dict().items())
    # dropout rates are not weights: a module trained with dropout takes them
    with_dropout = nn.Sequential(nn.Conv1d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Dropout(0.2), nn.Linear(4 * 6, 2))
    with pytest.raises(ValueError, match=r"layers: 4 entries in the model, 5 in the torch module"):
        torch_io.load_into(with_dropout, model)
    tm2 = _rand(nn.Sequential(nn.Linear(3, 8), nn.TransformerEncoderLayer(8, 2, 16, dropout=0.1, batch_first=True),
                              torch_io.GlobalAvgPool(), nn.Linear(8, 2)))
    fresh = nn.Sequential(nn.Linear(3, 8), nn.TransformerEncoderLayer(8, 2, 16, dropout=0.3, batch_first=True),
                          torch_io.GlobalAvgPool(), nn.Linear(8, 2))
    torch_io.load_into(fresh, torch_io.from_torch(tm2, ignore_dropout=True))
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), tm2.state_dict().values()))


def test_load_into_refuses_a_post_norm_checkpoint_for_a_pre_norm_module():
    tm = _rand(nn.Sequential(nn.Linear(3, 8), nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)))
    model = torch_io.from_torch(tm)
    assert model[1].norm_first is False
    pre = nn.Sequential(nn.Linear(3, 8), nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True,
                                                                    norm_first=True))
    with pytest.raises(ValueError, match=r"norm_first: only in the model"):
        torch_io.load_into(pre, model)
