"""Buffers asked for by name (layer.Buffers): what a layer's _allocate gets and what it must do.

A layer stores each buffer under the name it asks for; the set records the names, so a key seen
again gets exactly those values back (zeroed), views and 'none' included. A buffer stored under
another name, or a name asked for twice, is refused naming the layer and the buffer. The reuse
itself (views on the full batch's arrays, kept keys, interrupts) is covered inside MicroPython by
tests/mp/buffers_mp.py and tests/mp/fit_heap_mp.py.
"""
import pytest

import helpers  # noqa: F401  (the import path)
from microformer import Tensor
from microformer.layer import Layer


class _Probe(Layer):
    """_allocate asks for a float buffer, a mask, a view and an absent buffer; `misname` stores
    the float buffer under another attribute, `twice` asks for one name twice."""

    def __init__(self, misname=False, twice=False):
        self.misname = misname
        self.twice = twice
        self.allocations = 0

    def _allocate(self, stage, shape, other, bufs):
        self.allocations += 1
        if self.misname:
            self._out = bufs.zeros("_y", shape)
            return
        self._y = bufs.zeros("_y", shape)
        self._mask = bufs.bytes("_mask", shape[0])
        self._flat = bufs.view("_flat", self._y.reshape((-1,)))
        self._none = bufs.none("_none")
        if self.twice:
            self._y = bufs.zeros("_y", shape)

    def forward(self, x):
        self._buffers("_fwd", x.shape)
        self._y.fill(7.0)
        for i in range(len(self._mask)):
            self._mask[i] = 1
        return self._y


def test_a_key_seen_again_gets_its_named_buffers_back_zeroed():
    p = _Probe()
    y4 = p.forward(Tensor((4, 3)))
    mask4, flat4 = p._mask, p._flat
    assert p._none is None and flat4.data is y4.data
    y2 = p.forward(Tensor((2, 3)))
    assert y2.shape == (2, 3) and y2 is not y4 and p._mask is not mask4
    y4b = p.forward(Tensor((4, 3)))
    assert p.allocations == 2, "the key (4, 3) was made again instead of kept"
    assert y4b is y4 and p._mask is mask4 and p._flat is flat4
    # every forward fills its buffers; switching back to a key gives them zeroed
    p.forward(Tensor((2, 3)))
    p._buffers("_fwd", (4, 3))
    assert p._y is y4 and list(y4.data) == [0.0] * 12 and list(mask4) == [0] * 4


def test_smaller_key_is_a_view_on_the_larger_array():
    p = _Probe()
    p.forward(Tensor((4, 3)))
    big = p._y.data
    p.forward(Tensor((2, 3)))
    small = p._y.data
    assert len(small) == 6 and isinstance(small, memoryview) and small.obj is big


def test_a_buffer_stored_under_another_name_is_refused():
    with pytest.raises(RuntimeError, match=r"_Probe\._allocate: buffer '_y' is not stored as self\._y"):
        _Probe(misname=True).forward(Tensor((4, 3)))


def test_a_name_asked_for_twice_is_refused():
    with pytest.raises(ValueError, match=r"'_y' asked for twice"):
        _Probe(twice=True).forward(Tensor((4, 3)))
