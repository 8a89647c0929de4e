"""Gradient buffers appear on the first backward, go when a part is frozen and come back when it
trains again; a model built for inference holds none (tests/mp/grads_lazy_mp.py, under CPython
and both MicroPython ports; there the heap is also checked: using every grad of a built model
adds their buffers, which were not there)."""
import json

import pytest

import helpers

SCRIPT = helpers.script("grads_lazy_mp.py")


def _check(r):
    n = r["floats"]
    assert r["built"] == 0 and r["after_forward"] == 0, r
    assert r["after_backward"] == n, r
    assert r["frozen"] == r["head"] < n, r
    assert r["unfrozen"] == r["head"], r            # made again by the next use, not now
    assert r["trainable"] == n and r["after_fit"] == n and r["steps"] == 1, r
    if r["use_heap"] >= 0:
        # a built model's grads take no heap until used: then 4 bytes a float (and the arrays'
        # headers), all of it added by that use
        assert 4 * n <= r["use_heap"] < 4 * n + 128 * 20, (r["use_heap"], n)   # 20 arrays
        assert r["built_heap"] > 4 * n, r


def test_grads_lazy_cpython():
    import microformer as mf
    import grads_lazy_mp
    try:
        for name in ("python", "numpy"):
            _check(json.loads(json.dumps(grads_lazy_mp.run(name))))
    finally:
        mf.set_backend("python")


@pytest.mark.parametrize("backend", ["python", "viper"])
def test_grads_lazy_micropython(tmp_path, micropython, backend):
    out = tmp_path / "out.json"
    helpers.run_micropython(SCRIPT, backend, str(out), heap="4M", exe=micropython)
    _check(json.loads(out.read_text()))
