"""Optimizer steps and a whole Sequential (Iris model) vs the NumPy reference, CPython and MicroPython."""
import copy

import numpy as np
import pytest

import helpers
from helpers import assert_close, f32
import driver_mp
import reference as ref

TOL = 1e-4
OPTIMS = [
    ("SGD", {"lr": 0.1}),
    ("SGD", {"lr": 0.05, "momentum": 0.9}),
    ("SGD", {"lr": 0.05, "momentum": 0.5, "weight_decay": 0.01}),
    ("Adam", {"lr": 1e-3}),
    ("Adam", {"lr": 1e-2, "betas": [0.8, 0.99], "eps": 1e-6, "weight_decay": 0.1}),
    ("Adam", {"lr": 1e-2, "weight_decay": 0.1, "decoupled": True}),
]


def _optim_case(kind, kwargs, steps=4, clip=None, seed=3):
    rng = np.random.default_rng(seed)
    params = [f32(rng.normal(size=(3, 4))), f32(rng.normal(size=5))]
    grads = [[f32(rng.normal(size=p.shape)) for p in params] for _ in range(steps)]
    case = {"optim": {"type": kind, "kwargs": kwargs},
            "params": [{"shape": list(p.shape), "data": p.ravel().tolist()} for p in params],
            "grads": [[g.ravel().tolist() for g in gs] for gs in grads]}
    if clip:
        case["clip"] = clip
    # reference
    want, norms = [], []
    ps = [p.copy() for p in params]
    state = [[np.zeros_like(p), np.zeros_like(p)] for p in params]
    for t, gs in enumerate(grads, 1):
        if clip:
            gs, norm = ref.clip_grad_norm(gs, clip)
            norms.append(norm)
        for i, g in enumerate(gs):
            if kind == "SGD":
                ps[i], state[i][0] = ref.sgd_step(ps[i], g, state[i][0], kwargs["lr"],
                                                  kwargs.get("momentum", 0.0), kwargs.get("weight_decay", 0.0))
            else:
                b1, b2 = kwargs.get("betas", (0.9, 0.999))
                ps[i], state[i][0], state[i][1] = ref.adam_step(
                    ps[i], g, state[i][0], state[i][1], t, kwargs["lr"], b1, b2, kwargs.get("eps", 1e-8),
                    kwargs.get("weight_decay", 0.0), kwargs.get("decoupled", False))
        want.append([p.copy() for p in ps])
    return case, want, norms


def _check_optim(got, want, norms, what, tol=TOL):
    for step, (gp, wp) in enumerate(zip(got["p"], want, strict=True)):
        for i, (g, w) in enumerate(zip(gp, wp, strict=True)):
            assert_close(g, w, tol, "%s step %d param %d" % (what, step + 1, i))
    if norms:                         # a clipped case: one norm per step
        for g, w in zip(got["norm"], norms, strict=True):
            assert g == pytest.approx(w, rel=1e-5)
    else:
        assert "norm" not in got, what


@pytest.mark.parametrize("kind,kwargs", OPTIMS, ids=["%s %s" % (k, v) for k, v in OPTIMS])
def test_optimizer_cpython(kind, kwargs):
    case, want, norms = _optim_case(kind, kwargs)
    _check_optim(driver_mp.run_case(case), want, norms, kind)


def test_clip_grad_norm_cpython():
    case, want, norms = _optim_case("SGD", {"lr": 0.1}, clip=0.5)
    got = driver_mp.run_case(case)
    assert all(n > 0.5 for n in norms), "the case must actually clip"
    _check_optim(got, want, norms, "SGD clipped")


def _iris_model_case(seed=5, B=6):
    rng = np.random.default_rng(seed)
    spec = [{"type": "Dense", "args": [4, 32]}, {"type": "ActivationLayer", "args": ["relu"]},
            {"type": "Reshape", "args": [[4, 8]]}, {"type": "Attention", "args": [8, 2]},
            {"type": "GlobalAvgPool"}, {"type": "Dense", "args": [8, 3]}]
    p = {"0.W": rng.normal(scale=0.5, size=(32, 4)), "0.b": rng.normal(scale=0.1, size=32),
         "5.W": rng.normal(scale=0.5, size=(3, 8)), "5.b": rng.normal(scale=0.1, size=3)}
    for n in ("q", "k", "v", "o"):
        p["3.W" + n] = rng.normal(scale=0.4, size=(8, 8))
        p["3.b" + n] = rng.normal(scale=0.1, size=8)
    p = {k: f32(v) for k, v in p.items()}
    x = f32(rng.normal(size=(B, 4)))
    labels = [int(v) for v in rng.integers(0, 3, size=B)]
    # reference forward
    h0 = ref.dense_forward(x, p["0.W"], p["0.b"])
    h1 = ref.act_forward("relu", h0).reshape(B, 4, 8)
    ap = {k[2:]: v for k, v in p.items() if k.startswith("3.")}
    h3, cache = ref.attention_forward(h1, ap, 2)
    h4 = ref.avgpool_forward(h3)
    logits = ref.dense_forward(h4, p["5.W"], p["5.b"])
    loss, dlogits = ref.softmax_cross_entropy(logits, np.array(labels))
    want = {"logits": logits, "loss": np.array([loss])}
    dh4, want["d5.W"], want["d5.b"] = ref.dense_backward(dlogits, h4, p["5.W"])
    dh3 = ref.avgpool_backward(dh4, 4)
    dh1, g, _ = ref.attention_backward(dh3, cache, ap)
    for k, v in g.items():
        want["d3." + k[1:]] = v
    dh0 = ref.act_backward("relu", dh1.reshape(B, 32), h0)
    want["dx"], want["d0.W"], want["d0.b"] = ref.dense_backward(dh0, x, p["0.W"])
    for k in p:   # one Adam step from zero state: p - lr * g / (|g| + eps)
        if k == "3.bk":
            continue   # its gradient is 0 in theory, so Adam's step there is the sign of round-off
        want["new " + k] = ref.adam_step(p[k], want["d" + k], 0 * p[k], 0 * p[k], 1, 1e-2)[0]
    case = {"model": spec, "opt": {"type": "Adam", "kwargs": {"lr": 1e-2}},
            "params": {k: v.ravel().tolist() for k, v in p.items()},
            "x": {"shape": [B, 4], "data": x.ravel().tolist()}, "labels": labels}
    return case, want


def _check_model(got, want, what, tol=TOL):
    helpers.check_outputs(dict(got, loss=[got["loss"]]), want, tol, what)


def test_sequential_end_to_end_cpython():
    case, want = _iris_model_case()
    _check_model(driver_mp.run_case(copy.deepcopy(case)), want, "cpython")


@pytest.mark.parametrize("backend,tol", [("python", TOL), ("viper", 2e-3)])
def test_optimizers_and_model_micropython(tmp_path, micropython, backend, tol):
    cases, wants = [], []
    for kind, kwargs in OPTIMS:
        c, w, n = _optim_case(kind, kwargs)
        cases.append(c)
        wants.append(("optim", kind, w, n))
    c, w, n = _optim_case("SGD", {"lr": 0.1}, clip=0.5)
    cases.append(c)
    wants.append(("optim", "SGD clipped", w, n))
    c, w = _iris_model_case()
    cases.append(c)
    wants.append(("model", "Iris model", w, None))
    results = helpers.run_cases_micropython(cases, tmp_path, backend, exe=micropython)
    for got, (kind, what, w, n) in zip(results, wants, strict=True):
        if kind == "optim":
            _check_optim(got, w, n, "micropython %s %s" % (backend, what), tol)
        else:
            _check_model(got, w, "micropython %s %s" % (backend, what), tol)
