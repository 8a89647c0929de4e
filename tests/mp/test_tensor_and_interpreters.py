"""Tensor views, the PRNG and error messages agree between CPython and MicroPython."""
import json

import helpers
import microformer as mf


def _cpython_basics():
    return json.loads(helpers.run_cpython(helpers.script("basics_mp.py")))


def test_same_numbers_and_messages_in_both_interpreters(micropython):
    cp = _cpython_basics()
    mp = json.loads(helpers.run_micropython(helpers.script("basics_mp.py"), exe=micropython))
    assert cp == mp
    # xorshift32 by hand: x ^= x << 13; x ^= x >> 17; x ^= x << 5 (mod 2^32), from 42
    x, want = 42, []
    for _ in range(5):
        x ^= (x << 13) & 0xFFFFFFFF
        x ^= x >> 17
        x ^= (x << 5) & 0xFFFFFFFF
        want.append(x)
    assert cp["u32"] == want
    assert sorted(cp["shuffle"]) == list(range(10)) and cp["shuffle"] != list(range(10))
    assert cp["view"] == [[[9.0, 2.0, 3.0], [4.0, 5.0, 6.0]], [[9.0, 2.0], [3.0, 4.0], [5.0, 6.0]]]
    assert cp["errors"][0] == "ValueError: Attention: x must be [B,S,8], got (16, 4, 6)"
    assert cp["errors"][2] == "RuntimeError: Dense: backward() called before forward()"
    assert "labels must be ints in [0, 3), got 5 at index 1" in cp["errors"][3]


def test_xavier_bound_and_reseeding():
    mf.seed(5)
    a = mf.Dense(30, 20).W.data
    mf.seed(5)
    b = mf.Dense(30, 20).W.data
    assert list(a) == list(b)
    bound = (6.0 / 50) ** 0.5
    assert max(abs(v) for v in a) <= bound
    assert max(abs(v) for v in a) > 0.9 * bound     # really spread over the range


def test_buffers_are_reused_for_the_same_batch_shape():
    d = mf.Dense(4, 3)
    x = mf.Tensor((2, 4))
    y1 = d.forward(x)
    y2 = d.forward(x)
    assert y1 is y2
    assert d.forward(mf.Tensor((5, 4))).shape == (5, 3)


def test_frozen_layer_returns_dx_but_keeps_no_grads():
    d = mf.Dense(3, 2)
    d.trainable = False
    x = mf.Tensor.from_list([[1.0, 2.0, 3.0]])
    d.forward(x)
    dx = d.backward(mf.Tensor.from_list([[1.0, -1.0]]))
    assert any(v != 0.0 for v in dx.data)
    assert d.dW.data is None and d.db.data is None      # frozen: no grad buffers
    assert d.collect_params([]) == []
