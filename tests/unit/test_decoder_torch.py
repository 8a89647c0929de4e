"""DecoderBlock against torch.nn.TransformerDecoderLayer(norm_first=True, batch_first=True, dropout=0)
through state_dict: forward, input and memory gradients, parameter gradients (<= 1e-5 relative,
CPython, portable and NumPy backends), with and without padding masks. Needs torch (host only)."""
import numpy as np
import pytest

import helpers  # noqa: F401  (paths)
import microformer as mf
from torch_compare import F, torch, to_mf as _mf, to_np as _np, close as _close  # noqa: E402


def _layer(act, seed):
    tm = torch.nn.TransformerDecoderLayer(8, 2, 12, dropout=0.0, activation=act, batch_first=True,
                                          norm_first=True)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in tm.parameters():
            p.copy_(torch.rand(p.shape, generator=g) - 0.5)
    return tm


@pytest.mark.parametrize("act,kind", [("gelu", "gelu"), ("relu", "relu"),
                                      (lambda x: F.gelu(x, approximate="tanh"), "gelu_tanh")])
@pytest.mark.parametrize("padded", [False, True])
def test_transformer_decoder_layer(backend, act, kind, padded):
    tm = _layer(act, 3)
    blk = mf.DecoderBlock(8, 2, 12, activation=kind)
    assert list(blk.state_dict()) == list(tm.state_dict())
    assert blk.load_state_dict(tm.state_dict()) == ([], [])
    B, S, Sk = 2, 5, 4
    g = torch.Generator().manual_seed(4)
    x = (torch.rand(B, S, 8, generator=g) - 0.5).requires_grad_()
    m = (torch.rand(B, Sk, 8, generator=g) - 0.5).requires_grad_()
    tlen, mlen = ([5, 3], [2, 4]) if padded else (None, None)
    causal = torch.ones(S, S, dtype=torch.bool).triu(1)
    kw = {}
    if padded:
        kw = {"tgt_key_padding_mask": torch.arange(S)[None, :] >= torch.tensor(tlen)[:, None],
              "memory_key_padding_mask": torch.arange(Sk)[None, :] >= torch.tensor(mlen)[:, None]}
    ty = tm(x, m, tgt_mask=causal, tgt_is_causal=True, **kw)
    dy = torch.rand(ty.shape, generator=g) - 0.5
    (ty * dy).sum().backward()
    y = blk.forward(_mf(x), _mf(m), tgt_lengths=tlen, memory_lengths=mlen)
    _close(y, ty, "forward")
    dx = blk.backward(_mf(dy))
    dm = blk.dmemory
    _close(dx, x.grad, "d(x)")
    _close(dm, m.grad, "d(memory)")
    if padded:      # padded memory rows: no gradient
        assert np.all(_np(dm)[0, 2:] == 0)
    by_id = {id(p): gr for p, gr in blk.params()}
    tgrads = dict(tm.named_parameters())
    for name, parts in blk.state_parts():
        got = np.concatenate([_np(by_id[id(p)]).reshape(p.shape[0], -1) for p in parts])
        want = tgrads[name].grad.double().numpy().reshape(got.shape)
        _close(got, want, "grad " + name)


def test_torch_io_round_trip():
    """host/tools/torch_io converts nn.TransformerDecoderLayer to a DecoderBlock and back, weights and all;
    a post-norm layer is refused by name."""
    import torch_io
    tm = _layer("gelu", 8)
    blk = torch_io.from_torch(tm)
    assert type(blk).__name__ == "DecoderBlock"
    x = torch.rand(2, 3, 8) - 0.5
    m = torch.rand(2, 4, 8) - 0.5
    causal = torch.ones(3, 3, dtype=torch.bool).triu(1)
    _close(blk.forward(_mf(x), _mf(m)), tm(x, m, tgt_mask=causal), "from_torch forward")
    back = torch_io.to_torch(blk)
    assert isinstance(back, torch.nn.TransformerDecoderLayer)
    _close(back(x, m, tgt_mask=causal), tm(x, m, tgt_mask=causal), "to_torch forward")
    post = torch.nn.TransformerDecoderLayer(8, 2, 12, dropout=0.0, batch_first=True)
    with pytest.raises(ValueError) as e:
        torch_io.from_torch(post)
    assert "norm_first=True" in str(e.value) and "DecoderBlock" in str(e.value)
