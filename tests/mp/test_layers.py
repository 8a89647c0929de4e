"""Every layer, forward and every gradient: lib/ vs the NumPy reference, on CPython and inside MicroPython."""
import copy

import pytest

import helpers
from helpers import assert_close
import layer_cases
import driver_mp

CASES = layer_cases.all_cases()
IDS = [c[0] for c in CASES]
TOL = 1e-4


def _check(name, got, want):
    helpers.check_outputs(got, want, TOL, name)


@pytest.mark.parametrize("name,case,want", CASES, ids=IDS)
def test_layer_cpython(name, case, want):
    _check(name, driver_mp.run_case(copy.deepcopy(case)), want)


def test_layers_micropython(tmp_path, micropython):
    results = helpers.run_cases_micropython([c[1] for c in CASES], tmp_path, exe=micropython)
    assert len(results) == len(CASES)
    for (name, _, want), got in zip(CASES, results, strict=True):
        _check("micropython " + name, got, want)


VIPER_TOL = 2e-3   # block floating point: ~1e-4 typical, 2e-3 is the documented bound


def test_layers_micropython_viper(tmp_path, micropython):
    results = helpers.run_cases_micropython([c[1] for c in CASES], tmp_path, backend="viper", exe=micropython)
    assert len(results) == len(CASES)
    for (name, _, want), got in zip(CASES, results, strict=True):
        helpers.check_outputs(got, want, VIPER_TOL, "viper " + name)


def test_param_grads_accumulate():
    name, case, want = CASES[1]
    case = dict(copy.deepcopy(case), repeat=3)
    got = driver_mp.run_case(case)
    assert_close(got["dW"], 3 * want["dW"], TOL, "dW after 3 backward passes")
    assert_close(got["dx"], want["dx"], TOL, "dx is written, not accumulated")
