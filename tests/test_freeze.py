"""Composites freeze like Sequential, and buffers are reused one way (Layer._buffers).

tests/freeze_mp.py and tests/buffers_mp.py hold the checks; they run under CPython and inside
MicroPython (both interpreters) and raise on the first failure.
"""
import inspect

import helpers
import microformer as mf
from microformer.layer import Layer

FREEZE = helpers.script("freeze_mp.py")
BUFFERS = helpers.script("buffers_mp.py")


def _cpython(script):
    return helpers.run_cpython(script)


def test_freeze_cpython():
    assert "FREEZE OK 9" in _cpython(FREEZE)


def test_freeze_micropython(micropython):
    assert "FREEZE OK 9" in helpers.run_micropython(FREEZE, exe=micropython)


def test_buffers_cpython():
    assert "BUFFERS OK 11" in _cpython(BUFFERS)


def test_buffers_micropython(micropython):
    out = helpers.run_micropython(BUFFERS, exe=micropython)
    assert "BUFFERS OK 11" in out
    assert out.count("steady-state alloc 0)") == 8, out


def _layer_classes():
    seen = []
    for name in dir(mf):
        obj = getattr(mf, name)
        if isinstance(obj, type) and issubclass(obj, Layer) and obj is not Layer:
            seen.append(obj)
    return seen


def test_every_layer_backward_takes_grads():
    # a frozen Sequential or composite calls part.backward(dy, False): every layer must take it
    classes = _layer_classes()
    assert len(classes) >= 11, [c.__name__ for c in classes]
    for cls in classes:
        params = inspect.signature(cls.backward).parameters
        assert "grads" in params and params["grads"].default is True, cls.__name__
