"""LoRA and partial backward inside MicroPython: tests/mp/lora_mp.py on both interpreters (the
`micropython` fixture), on the portable and viper backends, against the same script under
CPython (portable backend, double-precision arithmetic on float32 storage).

- portable backend: every output within 1e-5 of CPython's;
- viper backend, Dense with an adapter: every output within the GEMM bound of README
  "Tolerances" (2^-11 K max|a| max|b| per product, plus 2^-11 of an addend), composed through
  the adapter's products y = x W^T + b + s (x A^T) B^T (see _dense_bounds);
- viper, attention and block cases: within 2e-3 of CPython's (the attention path's own bounds are
  pinned by test_viper_range.py; this coarse check catches a missing or misplaced adapter term,
  which moves these outputs by 0.1 or more);
- on viper a steady-state forward + backward of a Dense and an Attention with adapters, and of
  a model whose backward stops at its head, allocates nothing;
- merge() gives the unmerged outputs, partial backward's grads are bit-identical to the full
  backward's and a LoRA fine-tune lowers the loss leaving the base weights as they were (the
  script asserts these itself).
"""
import json

import numpy as np
import pytest

import helpers

SCRIPT = helpers.script("lora_mp.py")
U = 2.0 ** -11


def _cases(stdout):
    out = {}
    for line in stdout.splitlines():
        if line.startswith("CASE "):
            c = json.loads(line[5:])
            out[c["case"]] = {k: np.asarray(v, dtype=np.float64) for k, v in c["values"].items()}
    assert sorted(out) == ["attention", "attention_cross", "block", "dense", "merge"], sorted(out)
    return out


_REF = {}


def _reference():
    if not _REF:
        out = helpers.run_cpython(SCRIPT, "python")
        assert "LORA OK python" in out
        _REF.update(_cases(out))
    return _REF


def _max_abs(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


def _dense_bounds(c):
    # per-output bounds of the viper GEMMs, composed through the adapter (global maxima)
    N, C, OC, r, s = int(c["N"]), int(c["C"]), int(c["OC"]), int(c["r"]), float(c["s"])
    mx, mW, mb = np.abs(c["x"]).max(), np.abs(c["W"]).max(), np.abs(c["b"]).max()
    mA, mB, mdy = np.abs(c["A"]).max(), np.abs(c["B"]).max(), np.abs(c["dy"]).max()
    x = c["x"].reshape(N, C)
    A = c["A"].reshape(r, C)
    B = c["B"].reshape(OC, r)
    dy = c["dy"].reshape(N, OC)
    mhs = np.abs(s * x @ A.T).max()
    mdh = np.abs(s * dy @ B).max()
    e_h = U * C * mx * mA                         # x A^T
    e_hs = s * e_h
    e_dhs = U * OC * mdy * mB                     # dy B
    e_dh = s * e_dhs
    y = U * (C * mx * mW + mb) + U * r * (mhs + e_hs) * mB + r * mB * e_hs
    dx_base = U * OC * mdy * mW
    dx = dx_base + U * r * (mdh + e_dh) * mA + r * mA * e_dh + U * (np.abs(c["dx"]).max() + dx_base)
    dB = U * N * mdy * (mhs + e_hs) + N * mdy * e_hs
    dA = U * N * (mdh + e_dh) * mx + N * mx * e_dh
    slack = 1e-6                                  # float32 rounding of the stores
    return {"y": y + slack, "dx": dx + slack, "dB": dB + slack, "dA": dA + slack}


@pytest.mark.parametrize("backend", ["python", "viper"])
def test_lora_inside_micropython(micropython, backend):
    out = helpers.run_micropython(SCRIPT, backend, heap="8M", exe=micropython)
    assert "LORA OK " + backend in out
    assert "partial ok: 10 grads bit-identical, 10 frozen without buffers" in out
    if backend == "viper":            # steady state allocates nothing (the script asserts it)
        for name in ("dense", "attention", "head only"):
            assert "alloc %s ok" % name in out
    got = _cases(out)
    ref = _reference()
    for case in ("dense", "attention", "attention_cross", "block"):
        for key, want in ref[case].items():
            if key in ("x", "dy", "W", "b", "A", "B", "s", "N", "C", "OC", "r"):
                continue
            err = _max_abs(got[case][key], want)
            if backend == "python":
                tol = 1e-5
            elif case == "dense":
                tol = _dense_bounds(ref["dense"])[key]
            else:
                tol = 2e-3
            assert err <= tol, "%s %s %s: max error %.3g > %.3g" % (backend, case, key, err, tol)
    m = got["merge"]
    if backend == "python":
        assert _max_abs(m["merged"], m["unmerged"]) <= 1e-5
    else:
        assert _max_abs(m["merged"], m["unmerged"]) <= 2e-3
    assert _max_abs(m["unmerged"], ref["merge"]["unmerged"]) <= (1e-5 if backend == "python" else 2e-3)
