"""microformer.graph's layers (a residual, a CLS position, a learned token before the sequence, a
sum / maximum over the sequence, a NamedSequential keeping torch's names) against the NumPy
reference written from the math (tests/oracles/reference.py), the reference against finite differences and
against torch's autograd, on the portable and NumPy backends; their specs, plans and checkpoints."""
import numpy as np
import pytest

import helpers
import microformer as mf
import reference as ref
from microformer.graph import NamedSequential, PrependToken, Residual, SelectPosition, SeqReduce
from torch_compare import torch

B, S, E = 3, 5, 4


def _x(seed, shape=(B, S, E)):
    return np.random.default_rng(seed).normal(size=shape)


def _t(a):
    return mf.Tensor.from_list(np.asarray(a, dtype=np.float32).tolist())


def _np(t):
    return np.asarray(t.data, dtype=np.float64).reshape(t.shape)


def _f32(a):
    return helpers.f32(a)


@pytest.mark.parametrize("index", [0, 2, -1])
def test_select_position(backend, index):
    x, dy = _f32(_x(1)), _f32(_x(2, (B, E)))
    layer = SelectPosition(index)
    helpers.assert_close(_np(layer.forward(_t(x))), ref.select_position_forward(x, index), 1e-7, "y")
    helpers.assert_close(_np(layer.backward(_t(dy))), ref.select_position_backward(dy, S, index), 1e-7, "dx")
    # a second step at another index of the same layer shape leaves no gradient behind
    dy2 = _f32(_x(3, (B, E)))
    helpers.assert_close(_np(layer.backward(_t(dy2))), ref.select_position_backward(dy2, S, index), 1e-7, "dx2")
    with pytest.raises(ValueError, match="outside a sequence of 5"):
        SelectPosition(5).forward(_t(x))


def test_prepend_token(backend):
    x, dy = _f32(_x(4)), _f32(_x(5, (B, S + 1, E)))
    layer = PrependToken(E)
    tok = _f32(_x(6, (E,)))
    layer.W.data[:] = _t(tok.reshape(1, 1, E)).data
    helpers.assert_close(_np(layer.forward(_t(x))), ref.prepend_token_forward(x, tok), 1e-7, "y")
    dx = layer.backward(_t(dy))
    want_dx, want_dt = ref.prepend_token_backward(dy)
    helpers.assert_close(_np(dx), want_dx, 1e-7, "dx")
    helpers.assert_close(np.asarray(layer.dW.data), want_dt, 1e-6, "dtoken")
    layer.backward(_t(dy))                       # grads add up, as every layer's do
    helpers.assert_close(np.asarray(layer.dW.data), 2 * want_dt, 1e-6, "dtoken twice")
    assert layer.state_dict()[""] is layer.W


@pytest.mark.parametrize("kind", ["sum", "max"])
def test_seq_reduce(backend, kind):
    layer = SeqReduce(kind)
    for seed in (7, 8):                          # two steps: no sum or gradient carried over
        x, dy = _f32(_x(seed)), _f32(_x(seed + 10, (B, E)))
        y = _np(layer.forward(_t(x)))
        dx = _np(layer.backward(_t(dy)))
        if kind == "sum":
            helpers.assert_close(y, ref.seq_sum_forward(x), 1e-6, "y")
            helpers.assert_close(dx, ref.seq_sum_backward(dy, S), 1e-7, "dx")
        else:
            helpers.assert_close(y, ref.seq_max_forward(x), 1e-7, "y")
            helpers.assert_close(dx, ref.seq_max_backward(dy, x), 1e-7, "dx")


def test_residual_around_a_dense(backend):
    mf.seed(3)
    inner = mf.Dense(E, E)
    layer = Residual(inner)
    x, dy = _f32(_x(9)), _f32(_x(10))
    W, b = _np(inner.W), _np(inner.b)
    helpers.assert_close(_np(layer.forward(_t(x))), ref.residual_forward(x, lambda v: ref.dense_forward(v, W, b)),
                         1e-6, "y")
    dx = layer.backward(_t(dy))
    _, dW, db = ref.dense_backward(dy, x, W)
    helpers.assert_close(_np(dx), ref.residual_backward(dy, lambda g: ref.dense_backward(g, x, W)[0]), 1e-6, "dx")
    helpers.assert_close(_np(inner.dW), dW, 1e-6, "dW")
    helpers.assert_close(np.asarray(inner.db.data), db, 1e-6, "db")
    # a frozen residual still gives its input gradient, and leaves the inner grads alone
    before = list(inner.dW.data)
    layer.trainable = False
    helpers.assert_close(_np(layer.backward(_t(dy))), ref.residual_backward(dy, lambda g: ref.dense_backward(
        g, x, W)[0]), 1e-6, "frozen dx")
    assert inner.dW.data is None or list(inner.dW.data) == before


def test_the_reference_against_finite_differences():
    x, dy = _x(11), _x(12)
    tok = _x(13, (E,))
    dx, dt = ref.prepend_token_backward(np.concatenate([_x(14, (B, 1, E)), dy], axis=1))
    dyp = np.concatenate([_x(14, (B, 1, E)), dy], axis=1)
    np.testing.assert_allclose(ref.gradcheck(lambda: ref.prepend_token_forward(x, tok), x, dyp), dx, atol=1e-6)
    np.testing.assert_allclose(ref.gradcheck(lambda: ref.prepend_token_forward(x, tok), tok, dyp), dt, atol=1e-6)
    d2 = _x(15, (B, E))
    np.testing.assert_allclose(ref.gradcheck(lambda: ref.seq_max_forward(x), x, d2), ref.seq_max_backward(d2, x),
                               atol=1e-6)
    np.testing.assert_allclose(ref.gradcheck(lambda: ref.seq_sum_forward(x), x, d2), ref.seq_sum_backward(d2, S),
                               atol=1e-6)
    np.testing.assert_allclose(ref.gradcheck(lambda: ref.select_position_forward(x, -1), x, d2),
                               ref.select_position_backward(d2, S, -1), atol=1e-6)


def test_the_reference_against_torch():
    x = torch.tensor(_x(16), requires_grad=True)
    tok = torch.tensor(_x(17, (1, 1, E)), requires_grad=True)
    dy = _x(18, (B, S + 1, E))
    y = torch.cat([tok.expand(B, -1, -1), x], dim=1)
    (y * torch.tensor(dy)).sum().backward()
    np.testing.assert_allclose(ref.prepend_token_forward(x.detach().numpy(), tok.detach().numpy()), y.detach().numpy())
    dx, dt = ref.prepend_token_backward(dy)
    np.testing.assert_allclose(dx, x.grad.numpy())
    np.testing.assert_allclose(dt, tok.grad.numpy().reshape(E))
    for f, r, back in ((lambda v: v.sum(dim=1), ref.seq_sum_forward, lambda d, v: ref.seq_sum_backward(d, S)),
                       (lambda v: v.amax(dim=1), ref.seq_max_forward, lambda d, v: ref.seq_max_backward(d, v)),
                       (lambda v: v[:, 0], lambda v: ref.select_position_forward(v, 0),
                        lambda d, v: ref.select_position_backward(d, S, 0))):
        v = torch.tensor(_x(19), requires_grad=True)
        d = _x(20, (B, E))
        y = f(v)
        (y * torch.tensor(d)).sum().backward()
        np.testing.assert_allclose(r(v.detach().numpy()), y.detach().numpy(), atol=1e-12)
        np.testing.assert_allclose(back(d, v.detach().numpy()), v.grad.numpy(), atol=1e-12)


def _model():
    mf.seed(2)
    return NamedSequential([mf.Dense(E, 8), PrependToken(8),
                            Residual(NamedSequential([mf.LayerNorm(8), mf.Dense(8, 8)], ["blk.norm.", "blk.ff."])),
                            SeqReduce("max"), mf.Dense(8, 3)], ["stem.", "cls", "", "", "head."])


def test_named_sequential_names_spec_and_checkpoint(tmp_path):
    model = _model()
    assert list(model.state_dict()) == ["stem.weight", "stem.bias", "cls", "blk.norm.weight", "blk.norm.bias",
                                        "blk.ff.weight", "blk.ff.bias", "head.weight", "head.bias"]
    spec = mf.to_spec(model)
    from microformer import specplan
    assert [n for n, _ in specplan.named_shapes(spec)] == [n for n, _ in model.named_params()]
    assert specplan.plan(spec)[0] == model.param_count()
    ck = tmp_path / "g.mfck"
    mf.checkpoint.save(str(ck), model, {"spec": spec})
    back = mf.load_model(str(ck))
    x = _t(_f32(_x(21)))
    np.testing.assert_array_equal(_np(back(x)), _np(model(x)))
    # the spec is checked as every spec is
    bad = dict(spec, names=spec["names"][:-1])
    with pytest.raises(ValueError, match="as many 'names'"):
        mf.from_spec(bad)
    with pytest.raises(ValueError, match="as many 'names'"):
        specplan.plan(bad)


def test_named_sequential_trains():
    # a few Adam steps lower the loss: every part's gradient reaches the optimizer
    model = _model()
    opt = mf.Adam(model.parameters(), lr=0.02)
    loss = mf.CrossEntropyLoss()
    x = _t(_f32(_x(22, (6, S, E))))
    labels = [0, 1, 2, 0, 1, 2]
    first = None
    for _ in range(30):
        opt.zero_grad()
        v = loss.forward(model(x), labels)
        first = v if first is None else first
        model.backward(loss.backward())
        opt.step()
    assert v < 0.5 * first, (first, v)
    assert len(model.parameters()) == 9


def test_position_table(backend):
    # x + P[:, :S] with torch's [1, L, E] table, named by its container
    from microformer.graph import PositionTable
    layer = PositionTable(7, E)
    P = _f32(_x(23, (1, 7, E)))
    layer.W.data[:] = _t(P).data
    x, dy = _f32(_x(24)), _f32(_x(25))
    helpers.assert_close(_np(layer.forward(_t(x))), ref.learned_posembed_forward(x, P[0]), 1e-7, "y")
    dx = layer.backward(_t(dy))
    helpers.assert_close(_np(dx), dy, 1e-7, "dx")
    helpers.assert_close(_np(layer.dW)[0], ref.learned_posembed_backward(dy, 7)[1], 1e-6, "dP")
    assert layer.W.shape == (1, 7, E) and list(layer.state_dict()) == [""]
    m = NamedSequential([layer], ["pos"])
    assert list(m.state_dict()) == ["pos"] and [n for n, _ in m.named_params()] == ["pos"]
