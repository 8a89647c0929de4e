"""Composites freeze like Sequential, and buffers are reused one way (Layer._buffers).

tests/mp/freeze_mp.py and tests/mp/buffers_mp.py hold the checks; they run under CPython and inside
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
    assert "BUFFERS OK 15" in _cpython(BUFFERS)


def test_buffers_micropython(micropython):
    out = helpers.run_micropython(BUFFERS, exe=micropython)
    assert "BUFFERS OK 15" in out
    assert out.count("steady-state alloc 0)") == 9, out


def _layer_classes():
    # every public name, the lazily imported ones too (dir() lists only what is loaded so far)
    seen = []
    for name in sorted(set(dir(mf)) | set(mf._LAZY)):
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


def test_a_layer_of_ones_own_without_grads_argument_trains_in_sequential():
    class Double:                                   # the README's contract, nothing more
        def forward(self, x):
            self.y = mf.Tensor(x.shape, x.data.__class__("f", [2 * v for v in x.data]))
            return self.y

        def backward(self, dy):
            return mf.Tensor(dy.shape, dy.data.__class__("f", [2 * v for v in dy.data]))

        def collect_params(self, groups):
            return groups

        def params(self):
            return []

    mf.seed(1)
    model = mf.Sequential([mf.Dense(3, 4), Double(), mf.Dense(4, 2)])
    loss = mf.CrossEntropyLoss()
    loss.forward(model.forward(mf.Tensor.from_list([[1.0, 2.0, 3.0]])), [1])
    model.backward(loss.backward())
    assert any(v != 0.0 for v in model[0].dW.data)
