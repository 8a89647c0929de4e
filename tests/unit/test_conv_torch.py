"""Conv1D, MaxPool1D, AvgPool1D, LearnedPositionalEmbedding against real torch modules through
state_dict (forward, input gradients, parameter gradients <= 1e-5 relative; CPython, portable and
NumPy backends), and host/tools/torch_io.py converting them both ways. Needs torch (host only)."""
import pytest

import helpers  # noqa: F401  (paths)
import microformer as mf

from torch_compare import torch  # noqa: E402
import test_torch_interop as tti  # noqa: E402
import torch_io  # noqa: E402


def _cl(m, x):
    # a torch [B, C, L] module applied to channels-last x [B, L, C]
    return m(x.transpose(1, 2)).transpose(1, 2)


CONV = [  # Cin, Cout, k, stride, padding, dilation, groups, bias, L
    (3, 4, 3, 1, 0, 1, 1, True, 9),
    (4, 6, 3, 2, 2, 2, 2, True, 11),
    (6, 6, 5, 1, 2, 1, 6, True, 10),      # depthwise
    (4, 8, 3, 1, 1, 1, 4, False, 7),      # depthwise, two filters per channel, no bias
    (5, 3, 1, 1, 0, 1, 1, True, 6),       # pointwise
    (2, 3, 4, 3, 3, 1, 1, True, 4),
]


@pytest.mark.parametrize("cfg", CONV, ids=[str(c) for c in CONV])
def test_conv1d_vs_torch(backend, cfg):
    Cin, Cout, k, s, p, d, g, bias, L = cfg
    tm = tti._randomize(torch.nn.Conv1d(Cin, Cout, k, stride=s, padding=p, dilation=d, groups=g, bias=bias), 7)
    layer = mf.Conv1D(Cin, Cout, k, stride=s, padding=p, dilation=d, groups=g, use_bias=bias)
    tti._compare(tm, layer, [torch.rand(3, L, Cin) - 0.5], _cl, lambda l, x: l(x), "Conv1d%s" % (cfg,))


@pytest.mark.parametrize("k,s,p", [(2, None, 0), (3, 2, 1), (4, 1, 2), (5, 3, 2)])
@pytest.mark.parametrize("ties", [False, True])
def test_pooling_vs_torch(backend, k, s, p, ties):
    g = torch.Generator().manual_seed(k * 10 + p)
    x = (torch.randint(0, 3, (2, 11, 3), generator=g).float() * 0.5 if ties
         else torch.rand(2, 11, 3, generator=g) - 0.5)
    for tcls, mcls in ((torch.nn.MaxPool1d, mf.MaxPool1D), (torch.nn.AvgPool1d, mf.AvgPool1D)):
        tti._compare(tcls(k, s, p), mcls(k, s, p), [x], _cl, lambda l, x: l(x),
                     "%s k%d s%s p%d ties=%s" % (tcls.__name__, k, s, p, ties))


def test_learned_positions_vs_torch_module(backend):
    tm = tti._randomize(torch_io.LearnedPositionalEmbedding(9, 4), 3)
    tti._compare(tm, mf.LearnedPositionalEmbedding(9, 4), [torch.rand(2, 6, 4) - 0.5],
                 lambda m, x: m(x), lambda l, x: l(x), "LearnedPositionalEmbedding")


def _sensor_like():
    return torch.nn.Sequential(
        torch.nn.Unflatten(1, (20, 3)),
        torch_io.ChannelsLastConv1d(3, 8, 5, padding=2), torch.nn.ReLU(),
        torch_io.ChannelsLastMaxPool1d(2),
        torch_io.LearnedPositionalEmbedding(10, 8),
        torch_io.ChannelsLastConv1d(8, 8, 3, padding=1, groups=8),
        torch_io.ChannelsLastAvgPool1d(3, 1, 1),
        torch_io.GlobalAvgPool(), torch.nn.Linear(8, 4))


def test_torch_io_both_ways():
    tm = tti._randomize(_sensor_like(), 5)
    model = torch_io.from_torch(tm)
    assert [type(l).__name__ for l in model.layers][1:7] == [
        "Conv1D", "ActivationLayer", "MaxPool1D", "LearnedPositionalEmbedding", "Conv1D", "AvgPool1D"]
    x = torch.rand(4, 60) - 0.5
    tti._close(model(tti._mf(x)), tm(x), "from_torch forward")
    back = torch_io.to_torch(model)
    tti._close(back(x), tm(x), "to_torch forward")
    assert mf.to_spec(mf.from_spec(mf.to_spec(model))) == mf.to_spec(model)


@pytest.mark.parametrize("m,words", [
    (torch.nn.Conv1d(3, 4, 3), ["Conv1d", "[B, C, L]", "ChannelsLastConv1d"]),
    (torch.nn.MaxPool1d(2), ["MaxPool1d", "ChannelsLastMaxPool1d"]),
    (torch_io.ChannelsLastConv1d(3, 4, 3, padding="same"), ["padding='same'"]),
    (torch_io.ChannelsLastConv1d(3, 4, 3, padding=1, padding_mode="reflect"), ["padding_mode='reflect'"]),
    (torch_io.ChannelsLastAvgPool1d(3, count_include_pad=False), ["count_include_pad=True"]),
    (torch_io.ChannelsLastMaxPool1d(3, ceil_mode=True), ["ceil_mode=False"]),
])
def test_torch_io_refuses(m, words):
    with pytest.raises(ValueError) as e:
        torch_io.from_torch(m)
    for w in words:
        assert w in str(e.value), (w, str(e.value))
