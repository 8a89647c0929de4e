"""The NumPy backend (CPython, host): every layer, decoding, optimizer and model case gives the
portable backend's numbers within 1e-5, and it defines every kernel itself."""
import copy

import numpy as np
import pytest

import helpers
import family_cases
import layer_cases
import driver_mp
import test_optim_model as tom
import microformer as mf
from microformer import backend, kernels, kernels_numpy

TOL = 1e-5


def _both(run, case):
    out = {}
    for which in ("python", "numpy"):
        mf.set_backend(which)
        try:
            out[which] = run(copy.deepcopy(case))
        finally:
            mf.set_backend("python")
    return out["python"], out["numpy"]


def _flat(v):
    """Any nesting of lists (ragged too) or a number -> one float64 vector."""
    if isinstance(v, (list, tuple)):
        parts = [_flat(x) for x in v]
        return np.concatenate(parts) if parts else np.zeros(0)
    return np.asarray(v, dtype=np.float64).ravel()


def _same(portable, fast, what, ref=None, ignore=()):
    """numpy vs portable, key by key, relative to the key's largest value; an output that the
    NumPy reference says is exactly 0 (round-off on both sides) is judged at the case's scale."""
    case_scale = max(float(np.abs(_flat(v)).max()) for v in (ref or portable).values())
    assert isinstance(fast, dict) and set(fast) == set(portable), "%s: keys %s vs %s" % (
        what, sorted(fast) if isinstance(fast, dict) else fast, sorted(portable))
    for key, want in portable.items():
        if key in ignore:
            continue
        got = fast[key]
        want = _flat(want)
        got = _flat(got)
        assert got.shape == want.shape, "%s %s: shape %s vs %s" % (what, key, got.shape, want.shape)
        top = float(np.abs(want).max()) if want.size else 0.0
        scale = max(top, 1e-6)
        zero = (float(np.abs(_flat(ref[key])).max()) <= 1e-9 * case_scale if ref and key in ref
                else top <= 1e-6 * case_scale)
        if zero:
            scale = case_scale
        err = float(np.abs(got - want).max()) / scale if want.size else 0.0
        assert err <= TOL, "%s %s: numpy vs portable relative error %.3g > %g" % (what, key, err, TOL)


def test_every_kernel_is_numpy():
    names = [n for n in dir(kernels) if not n.startswith("_") and callable(getattr(kernels, n))
             and getattr(getattr(kernels, n), "__module__", "") == kernels.__name__]
    assert len(names) > 20
    missing = [n for n in names if getattr(getattr(kernels_numpy, n, None), "__module__", "")
               != kernels_numpy.__name__]
    assert not missing, "kernels without a NumPy version: %s" % missing


CORE = layer_cases.all_cases()
FAMILY = family_cases.all_cases()


@pytest.mark.parametrize("name,case,want", CORE, ids=[c[0] for c in CORE])
def test_core_layers(name, case, want):
    p, f = _both(driver_mp.run_case, case)
    _same(p, f, name, want)
    helpers.check_outputs(f, want, 1e-4, "numpy " + name)       # and the NumPy reference


@pytest.mark.parametrize("name,case,want", FAMILY, ids=[c[0] for c in FAMILY])
def test_family_layers(name, case, want):
    p, f = _both(driver_mp.run_case, case)
    _same(p, f, name, want)
    helpers.check_outputs(f, want, 1e-4, "numpy " + name)


@pytest.mark.parametrize("name,case", family_cases.DECODE, ids=[c[0] for c in family_cases.DECODE])
def test_decoding(name, case):
    p, f = _both(driver_mp.run_case, case)
    _same(p, f, name)


@pytest.mark.parametrize("kind,kwargs", tom.OPTIMS, ids=["%s %s" % (k, v) for k, v in tom.OPTIMS])
def test_optimizers(kind, kwargs):
    case, want, norms = tom._optim_case(kind, kwargs, clip=0.5 if kind == "SGD" else None)
    p, f = _both(driver_mp.run_case, case)
    _same(p, f, "%s %s" % (kind, kwargs))
    tom._check_optim(f, want, norms, "numpy " + kind)


def test_iris_model_step():
    case, want = tom._iris_model_case()
    p, f = _both(driver_mp.run_case, case)
    # Adam's first step on 3.bk, whose gradient is 0 in theory, is the sign of round-off
    _same(p, f, "Iris model", want, ignore={"new 3.bk"})


def test_kernels_write_the_callers_buffers_in_place():
    # no copies: the layer's own array('f') holds the result
    mf.set_backend("numpy")
    try:
        d = mf.Dense(3, 2)
        x = mf.Tensor.from_list([[1.0, 2.0, 3.0]])
        y = d.forward(x)
        want = [sum(d.W.data[o * 3 + c] * x.data[c] for c in range(3)) + d.b.data[o] for o in range(2)]
    finally:
        mf.set_backend("python")
    assert y.data.tolist() == pytest.approx(want, rel=1e-6)


def test_backend_names():
    assert "numpy" in backend.available()
    with pytest.raises(ValueError, match="expected 'python', 'viper', 'numpy' or 'native', got 'torch'"):
        mf.set_backend("torch")


def _default_backend(prelude=""):
    import subprocess
    import sys
    code = prelude + "import microformer; print(microformer.get_backend())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": helpers.LIB}).stdout
    return out.strip()


def test_numpy_is_the_default_on_cpython_and_portable_without_numpy():
    assert _default_backend() == "numpy"
    # an interpreter where `import numpy` fails gets the portable loops
    assert _default_backend("import sys; sys.modules['numpy'] = None\n") == "python"
