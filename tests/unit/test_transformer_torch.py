"""The whole encoder-decoder Transformer against torch: nn.Transformer(norm_first=True,
batch_first=True, dropout=0) with token embeddings, sinusoidal positional encodings and the output
projection (host/tools/torch_io.Seq2SeqTransformer, whose state_dict names are microformer's). Forward,
every parameter gradient (<= 1e-5 relative, CPython, portable and NumPy backends), with and
without source/target padding; from_torch / to_torch round trip. Needs torch (host only)."""
import numpy as np
import pytest

import microformer as mf
from torch_compare import torch, to_np as _np, close as _close  # noqa: E402
import torch_io  # noqa: E402

V_SRC, V_TGT, E, H, FF = 11, 13, 8, 2, 12


def _torch_model(seed, activation="gelu", n_enc=2, n_dec=2):
    tm = torch_io.Seq2SeqTransformer(V_SRC, V_TGT, E, H, FF, n_enc, n_dec, max_len=12, activation=activation)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in tm.parameters():
            p.copy_(torch.rand(p.shape, generator=g) - 0.5)
    return tm


def _ids(B, S, V, seed):
    return torch.randint(0, V, (B, S), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("activation", ["gelu", "relu"])
@pytest.mark.parametrize("padded", [False, True])
def test_transformer_equals_nn_transformer(backend, activation, padded):
    tm = _torch_model(3, activation)
    tm.train()                           # dropout=0: the same numbers, and torch's slow (exact) path
    m = mf.Transformer(V_SRC, V_TGT, E, H, FF, 2, 2, max_len=12, activation=activation)
    assert sorted(m.state_dict()) == sorted(tm.state_dict())
    assert m.load_state_dict(tm.state_dict()) == ([], [])
    B, Ss, St = 3, 6, 5
    src, tgt = _ids(B, Ss, V_SRC, 4), _ids(B, St, V_TGT, 5)
    slen, tlen = ([6, 4, 2], [5, 3, 1]) if padded else (None, None)
    ty = tm(src, tgt, slen, tlen)
    dy = torch.rand(ty.shape, generator=torch.Generator().manual_seed(6)) - 0.5
    (ty * dy).sum().backward()
    y = m.forward(src.tolist(), tgt.tolist(), slen, tlen)
    _close(y, ty, "forward")
    m.backward(mf.Tensor.from_list(dy.tolist()))
    by_id = {id(p): gr for p, gr in m.params()}
    tgrads = dict(tm.named_parameters())
    names = [name for name, _ in m.state_parts()]
    assert sorted(names) == sorted(tgrads)
    for name, parts in m.state_parts():
        got = np.concatenate([_np(by_id[id(p)]).reshape(p.shape[0], -1) for p in parts])
        want = tgrads[name].grad.double().numpy().reshape(got.shape)
        _close(got, want, "grad " + name)
    if padded:
        # padding is what the masks hide: a padded source token changes nothing, on both sides
        src2 = src.clone()
        src2[2, 2:] = (src2[2, 2:] + 1) % V_SRC
        with torch.no_grad():
            ty2 = tm(src2, tgt, slen, tlen)
        np.testing.assert_allclose(ty2.numpy(), ty.detach().numpy(), rtol=0, atol=1e-6)
        y2 = _np(m.forward(src2.tolist(), tgt.tolist(), slen, tlen))
        np.testing.assert_allclose(y2, _np(ty), rtol=0, atol=1e-5)


def test_torch_io_round_trip(backend):
    tm = _torch_model(8, "gelu", 1, 2)
    tm.eval()
    m = torch_io.from_torch(tm)
    assert type(m).__name__ == "Transformer" and len(m.encoder) == 1 and len(m.decoder) == 2
    src, tgt = _ids(2, 4, V_SRC, 9), _ids(2, 3, V_TGT, 10)
    with torch.no_grad():
        want = tm(src, tgt, [4, 2], [3, 2])
    _close(m.forward(src.tolist(), tgt.tolist(), [4, 2], [3, 2]), want, "from_torch forward")
    back = torch_io.to_torch(m).eval()
    assert isinstance(back, torch_io.Seq2SeqTransformer)
    with torch.no_grad():
        _close(back(src, tgt, [4, 2], [3, 2]), want, "to_torch forward")
    mf.seed(1)
    d = mf.Transformer(V_SRC, V_TGT, E, H, FF, dropout=0.2)
    assert torch_io.to_torch(d).decoder.layers[0].dropout3.p == pytest.approx(0.2)
    assert torch_io.from_torch(torch_io.to_torch(d)).dropout == pytest.approx(0.2)


def test_torch_io_refuses_what_it_cannot_convert():
    tm = _torch_model(11)
    tm.decoder.layers[1].dropout.p = 0.1
    for d in (tm.decoder.layers[1].dropout1, tm.decoder.layers[1].dropout2, tm.decoder.layers[1].dropout3):
        d.p = 0.1
    tm.decoder.layers[1].self_attn.dropout = tm.decoder.layers[1].multihead_attn.dropout = 0.1
    with pytest.raises(ValueError, match=r"Seq2SeqTransformer.*layers' dropouts differ \(0, 0.1\)"):
        torch_io.from_torch(tm)
    assert torch_io.from_torch(tm, ignore_dropout=True).dropout == 0.0
    tm = _torch_model(12)
    tm.encoder.norm.eps = 1e-6
    with pytest.raises(ValueError, match=r"layer_norm_eps=1e-06"):
        torch_io.from_torch(tm)
