"""Every layer, forward and every gradient: lib/ vs the NumPy reference, on CPython and inside MicroPython."""
import copy

import numpy as np
import pytest

import helpers
from helpers import assert_close
import layer_cases
import mf_driver

CASES = layer_cases.all_cases()
IDS = [c[0] for c in CASES]
TOL = 1e-4


def _check(name, got, want):
    assert set(want) <= set(got), "%s: missing outputs %s" % (name, set(want) - set(got))
    case_scale = max(float(np.abs(v).max()) for v in want.values())
    for key, value in want.items():
        if np.abs(value).max() <= 1e-9 * case_scale:
            # mathematically zero (dbk: softmax ignores a shift shared by all keys; S=1: A is 1):
            # float32 round-off is judged against the case's largest value instead
            err = float(np.abs(np.asarray(got[key]) - value.ravel()).max()) / case_scale
            assert err <= TOL, "%s %s: should be 0, error %.3g of the case scale" % (name, key, err)
        else:
            assert_close(got[key], value, TOL, "%s %s" % (name, key))


@pytest.mark.parametrize("name,case,want", CASES, ids=IDS)
def test_layer_cpython(name, case, want):
    _check(name, mf_driver.run_case(copy.deepcopy(case)), want)


def test_layers_micropython(tmp_path):
    results = helpers.run_cases_micropython([c[1] for c in CASES], tmp_path)
    assert len(results) == len(CASES)
    for (name, _, want), got in zip(CASES, results):
        _check("micropython " + name, got, want)


def test_param_grads_accumulate():
    name, case, want = CASES[1]
    case = dict(copy.deepcopy(case), repeat=3)
    got = mf_driver.run_case(case)
    assert_close(got["dW"], 3 * want["dW"], TOL, "dW after 3 backward passes")
    assert_close(got["dx"], want["dx"], TOL, "dx is written, not accumulated")
