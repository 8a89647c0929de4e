# Buffer reuse (Layer._buffers, the one mechanism every layer and loss uses): runs under CPython
# and inside MicroPython, directly
#   MICROPYPATH=lib:tests/mp micropython tests/mp/buffers_mp.py
# prints one line per layer and raises AssertionError on the first failure.
#
# Per layer: a second forward/backward at the same shape hands out the same output and input-
# gradient objects (reused) with the same values; another input of that shape gives other
# outputs; a new batch size gives buffers of the new shape;
# going back gives the right shape again. Inside MicroPython on the viper backend, a steady-state
# forward + backward allocates 0 bytes of heap where every kernel the layer calls has a viper
# version (LayerNorm, 'gelu', Embedding, the positional encodings and the 1-D pools run portable
# kernels, which allocate floats: their cases check reuse only).
import gc
import sys

import microformer as mf

MICRO = sys.implementation.name == "micropython"
if MICRO:
    mf.set_backend("viper")


def _x(shape, seed, ints=0):
    rng = mf.Rng(seed)
    t = mf.Tensor(shape)
    for i in range(t.size):
        t.data[i] = rng.next_u32() % ints if ints else rng.uniform(-1.0, 1.0)
    return t


def _cases():
    mf.seed(3)
    ids = lambda B: _x((B, 5), 1, ints=7)
    seq = lambda B: _x((B, 5, 8), 2)
    return [
        ("Dense", mf.Dense(8, 6), lambda B: _x((B, 8), 3), (6,)),
        ("ActivationLayer", mf.ActivationLayer("relu"), lambda B: _x((B, 4, 3), 4), (4, 3)),
        ("Reshape", mf.Reshape((2, 4)), lambda B: _x((B, 8), 5), (2, 4)),
        ("Attention", mf.Attention(8, 2), seq, (5, 8)),
        ("Attention(causal)", mf.Attention(8, 2, causal=True), seq, (5, 8)),
        ("GlobalAvgPool", mf.GlobalAvgPool(), seq, (8,)),
        ("Embedding", mf.Embedding(7, 8), ids, (5, 8), False),
        ("PositionalEncoding", mf.PositionalEncoding(6, 8), seq, (5, 8), False),
        ("FeedForward", mf.FeedForward(8, 12, "relu"), seq, (5, 8)),
        ("Conv1D", mf.Conv1D(8, 4, 3, padding=1), seq, (5, 4)),
        ("MaxPool1D", mf.MaxPool1D(2), seq, (2, 8), False),
        ("AvgPool1D", mf.AvgPool1D(2, padding=1), seq, (3, 8), False),
        ("LearnedPositionalEmbedding", mf.LearnedPositionalEmbedding(6, 8), seq, (5, 8), False),
        ("Sequential", mf.Sequential([mf.Dense(8, 16), mf.Reshape((2, 8)), mf.Attention(8, 2),
                                      mf.GlobalAvgPool(), mf.Dense(8, 3)]), lambda B: _x((B, 8), 6), (3,)),
    ]


def _pass(layer, x, dy):
    y = layer.forward(x)
    dx = layer.backward(dy)
    return y, dx


def _alloc(layer, x, dy):
    gc.collect()
    gc.disable()
    try:
        a0 = gc.mem_alloc()
        layer.forward(x)
        layer.backward(dy)
        return gc.mem_alloc() - a0
    finally:
        gc.enable()


def check(name, layer, make_x, out_tail, viper_only=True):
    x4, x2 = make_x(4), make_x(2)
    dy4, dy2 = _x((4,) + out_tail, 7), _x((2,) + out_tail, 8)
    y, dx = _pass(layer, x4, dy4)
    first = (list(y.data), None if dx is None else list(dx.data))
    y_b, dx_b = _pass(layer, x4, dy4)
    assert y_b is y and dx_b is dx, "%s: a second step at the same shape allocated new buffers" % name
    assert (list(y_b.data), None if dx_b is None else list(dx_b.data)) == first, \
        "%s: the same input gave other values" % name
    # another input Tensor of the same shape (its values reversed): the outputs follow it
    xr = mf.Tensor(x4.shape)
    n = x4.size
    for i in range(n):
        xr.data[i] = x4.data[n - 1 - i]
    yr, _ = _pass(layer, xr, dy4)
    assert list(yr.data) != first[0], "%s: a new input gave the old output" % name
    y2, dx2 = _pass(layer, x2, dy2)
    assert y2.shape == (2,) + out_tail, "%s: batch 2 gave output %r" % (name, y2.shape)
    assert dx is None or dx2.shape == x2.shape, "%s: batch 2 gave dx %r" % (name, dx2.shape)
    y4, dx4 = _pass(layer, x4, dy4)
    assert y4.shape == (4,) + out_tail and (dx is None or dx4.shape == x4.shape), \
        "%s: back to batch 4 gave %r" % (name, y4.shape)
    assert (list(y4.data), None if dx4 is None else list(dx4.data)) == first, \
        "%s: back to batch 4 gave other values" % name
    alloc = _alloc(layer, x4, dy4) if MICRO and viper_only else None
    if alloc is not None:
        assert alloc == 0, "%s: a steady-state forward + backward allocated %d bytes" % (name, alloc)
    print("buffers %-20s ok (steady-state alloc %s)" % (name, alloc))
    return alloc


def check_loss():
    lf = mf.CrossEntropyLoss()
    a = _x((4, 3), 9)
    lf.forward(a, [0, 1, 2, 0])
    g = lf.backward()
    lf.forward(a, [0, 1, 2, 0])
    assert lf.backward() is g, "CrossEntropyLoss: a new gradient buffer at the same shape"
    lf.forward(_x((2, 3), 9), [0, 1])
    assert lf.backward().shape == (2, 3)
    print("buffers %-20s ok" % "CrossEntropyLoss")


def main():
    n = 0
    for case in _cases():
        check(*case)
        n += 1
    check_loss()
    print("BUFFERS OK %d" % (n + 1))


main()
