# Attention(recompute=True) keeps the weights of one batch item and computes each item's again in
# backward: outputs, input gradients and every parameter gradient bit for bit those of the stored
# path, on every backend. Runs under CPython and inside MicroPython, directly:
#   MICROPYPATH=lib:tests/mp micropython tests/mp/recompute_mp.py [BACKEND]
# prints one line per case and raises AssertionError on the first failure.
import sys

import microformer as mf

if len(sys.argv) > 1:
    mf.set_backend(sys.argv[1])


def _x(shape, seed):
    rng = mf.Rng(seed)
    t = mf.Tensor(shape)
    for i in range(t.size):
        t.data[i] = rng.uniform(-2.0, 2.0)
    return t


def _run(recompute, causal, how, block):
    # two steps at batch 3 then one at batch 2 (a new key); returns the bytes of everything
    mf.seed(7)
    if block:
        layer = mf.EncoderBlock(8, 2, 16, causal=causal)
        attn = layer.attn
    else:
        layer = attn = mf.Attention(8, 2, causal=causal)
    attn.recompute = recompute
    out = []
    for k, B in enumerate((3, 3, 2)):
        for _, g in layer.params():
            g.fill(0.0)
        x = _x((B, 5, 8), 10 + k)
        kw = {}
        if how == "lengths":
            kw["lengths"] = [5, 3, 1][:B]
        elif how == "mask":
            kw["key_padding_mask"] = [[0, 0, 1, 0, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]][:B]
        y = layer.forward(x, **kw)
        got = [bytes(y.data)]
        dx = layer.backward(_x(y.shape, 20 + k))
        got.append(bytes(dx.data))
        for _, g in layer.params():
            got.append(bytes(g.data))
        out.append(got)
    return out, attn


def check(causal, how, block):
    name = "causal=%s %s block=%s" % (causal, how, block)
    ref, _ = _run(False, causal, how, block)
    got, attn = _run(True, causal, how, block)
    assert attn._A.shape[0] == 1, "%s: the weights are kept for %d items" % (name, attn._A.shape[0])
    for s in range(len(ref)):
        for i in range(len(ref[s])):
            assert got[s][i] == ref[s][i], "%s: step %d, tensor %d differs from the stored path" % (name, s, i)
    try:
        attn.weights()
        raise AssertionError("weights() ran on one item's weights")
    except ValueError:
        pass
    print("recompute %s: bit-identical" % name)


def main():
    n = 0
    for causal in (False, True):
        for how in ("none", "lengths", "mask"):
            for block in (False, True):
                check(causal, how, block)
                n += 1
    # the flag makes the forward's buffers again: the stored path and weights() come back
    a = mf.Attention(8, 2)
    a.recompute = True
    a.forward(_x((3, 5, 8), 1))
    assert a._A.shape[0] == 1
    a.recompute = False
    a.forward(_x((3, 5, 8), 1))
    assert a._A.shape[0] == 3 and len(a.weights(2, 1)) == 5
    print("RECOMPUTE OK %d (%s)" % (n, mf.get_backend()))


main()
