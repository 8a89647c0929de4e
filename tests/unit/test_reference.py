"""The judge is checked too: tests/oracles/reference.py gradients vs central finite differences."""
import numpy as np
import pytest

import helpers  # noqa: F401
import reference as ref

RNG = np.random.default_rng(7)


def _fd_close(analytic, numeric):
    np.testing.assert_allclose(analytic, numeric, rtol=1e-5, atol=1e-7)


def test_dense_grads():
    x, W, b = RNG.normal(size=(3, 5)), RNG.normal(size=(4, 5)), RNG.normal(size=4)
    dy = RNG.normal(size=(3, 4))
    dx, dW, db = ref.dense_backward(dy, x, W)
    f = lambda: ref.dense_forward(x, W, b)
    _fd_close(dx, ref.gradcheck(f, x, dy))
    _fd_close(dW, ref.gradcheck(f, W, dy))
    _fd_close(db, ref.gradcheck(f, b, dy))


@pytest.mark.parametrize("kind", ["relu", "leaky_relu", "gelu", "gelu_tanh", "tanh", "sigmoid"])
def test_activation_grads(kind):
    x = RNG.normal(size=(4, 6))
    x[np.abs(x) < 1e-3] = 0.5     # keep finite differences away from the ReLU kink
    dy = RNG.normal(size=x.shape)
    _fd_close(ref.act_backward(kind, dy, x), ref.gradcheck(lambda: ref.act_forward(kind, x), x, dy))


def test_avgpool_grads():
    x, dy = RNG.normal(size=(2, 3, 4)), RNG.normal(size=(2, 4))
    _fd_close(ref.avgpool_backward(dy, 3), ref.gradcheck(lambda: ref.avgpool_forward(x), x, dy))


@pytest.mark.parametrize("causal,mask,Sk", [(False, None, None), (True, None, None),
                                            (False, [[0, 1, 0, 0], [1, 1, 1, 1]], None),
                                            (False, None, 5)])
def test_attention_grads(causal, mask, Sk):
    B, S, E, H = 2, 4, 6, 2
    x = RNG.normal(size=(B, S, E))
    ctx = RNG.normal(size=(B, Sk, E)) if Sk else None
    p = {n: RNG.normal(scale=0.5, size=(E, E)) for n in ("Wq", "Wk", "Wv", "Wo")}
    p.update({n: RNG.normal(scale=0.2, size=E) for n in ("bq", "bk", "bv", "bo")})
    dy = RNG.normal(size=(B, S, E))
    y, cache = ref.attention_forward(x, p, H, causal, mask, ctx)
    dx, g, dctx = ref.attention_backward(dy, cache, p)
    f = lambda: ref.attention_forward(x, p, H, causal, mask, ctx)[0]
    _fd_close(dx, ref.gradcheck(f, x, dy))
    for n in p:
        _fd_close(g["d" + n], ref.gradcheck(f, p[n], dy))
    if Sk:
        _fd_close(dctx, ref.gradcheck(f, ctx, dy))
    if mask is not None:
        assert np.all(cache["A"][1] == 0.0) and np.all(y[1] == p["bo"]), "all-padded row gives output bo"


def test_softmax_cross_entropy_grad_and_value():
    logits, labels = RNG.normal(size=(5, 3)), np.array([0, 2, 1, 1, 0])
    loss, d = ref.softmax_cross_entropy(logits, labels)
    p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    assert loss == pytest.approx(-np.mean(np.log(p[np.arange(5), labels])))
    f = lambda: np.array([ref.softmax_cross_entropy(logits, labels)[0]])
    _fd_close(d, ref.gradcheck(f, logits, np.ones(1)))


def test_mse_grad():
    a, b = RNG.normal(size=(3, 4)), RNG.normal(size=(3, 4))
    _, d = ref.mse(a, b)
    _fd_close(d, ref.gradcheck(lambda: np.array([ref.mse(a, b)[0]]), a, np.ones(1)))
