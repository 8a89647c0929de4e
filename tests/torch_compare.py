"""What the PyTorch comparison tests share: torch itself (a missing torch skips the importing test
module, except under CI, where it is an error), conversions and the relative-error check."""
import array
import os

import numpy as np
import pytest

import microformer as mf

torch = pytest.importorskip("torch") if not os.environ.get("CI") else __import__("torch")
F = torch.nn.functional
TOL = 1e-5


def to_mf(t):
    """A torch tensor as a microformer Tensor (float32)."""
    return mf.Tensor(tuple(t.shape), array.array("f", t.detach().reshape(-1).tolist()))


def to_np(t):
    """A microformer Tensor, NumPy array or torch tensor as a float64 NumPy array."""
    if isinstance(t, mf.Tensor):
        return np.asarray(t.data, dtype=np.float64).reshape(t.shape)
    if isinstance(t, np.ndarray):
        return t.astype(np.float64)
    return t.detach().double().numpy()


def close(got, want, what, tol=TOL):
    """Assert equal shapes and max |got - want| <= tol max |want|; the relative error."""
    got, want = to_np(got), to_np(want)
    assert got.shape == want.shape, "%s: shape %s vs %s" % (what, got.shape, want.shape)
    err = float(np.abs(got - want).max()) / max(float(np.abs(want).max()), 1e-12)
    assert err <= tol, "%s: relative error %.3g > %g" % (what, err, tol)
    return err
