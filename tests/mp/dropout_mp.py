# Dropout's masks and numbers from one seed, printed so that CPython and every MicroPython port can
# be compared line by line (tests/mp/test_dropout.py); also checks eval() is the identity bit for bit.
#   MICROPYPATH=lib:board:board/demos:board/benchmarks:tests/mp micropython tests/mp/dropout_mp.py [backend]
import sys

import microformer as mf
from microformer.tensor import Rng, Tensor


def bits(buf, n):
    return "".join("1" if buf[i] else "0" for i in range(n))


def data(shape, seed):
    r = Rng(seed)
    t = Tensor(shape)
    for i in range(t.size):
        t.data[i] = r.signed_unit()          # exact in float32 and float64
    return t


def main(backend):
    mf.set_backend(backend)
    mf.seed(21)
    d = mf.Dropout(0.3)
    x = data((4, 25), 3)
    y = d.forward(x)
    print("dropout mask", bits(d.mask(), 100))
    dx = d.backward(data((4, 25), 4))
    zeros = [i for i in range(100) if dx.data[i] == 0.0]
    print("dropout backward zeros", ",".join(str(i) for i in zeros))
    d.eval()
    assert d.forward(x) is x, "eval Dropout must return its input"

    mf.seed(21)
    blk = mf.EncoderBlock(8, 2, 16, dropout=0.25)
    mf.seed(21)
    plain = mf.EncoderBlock(8, 2, 16)
    same = all(list(p.data) == list(q.data) for (p, _), (q, _) in zip(blk.params(), plain.params()))
    assert same and len(blk.params()) == len(plain.params()), "dropout changed the initial weights"
    x = data((2, 5, 8), 5)
    blk.forward(x)
    print("attn keep", bits(blk.attn._keep, 2 * 2 * 5 * 5))
    print("drop1", bits(blk.drop1.mask(), 80))
    print("ffn drop", bits(blk.ffn.drop.mask(), 160))
    print("drop2", bits(blk.drop2.mask(), 80))
    blk.eval()
    y = blk.forward(x)
    yp = plain.forward(x)
    assert list(y.data) == list(yp.data), "eval EncoderBlock(dropout) differs from dropout=0"
    print("eval identity ok")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "python")
