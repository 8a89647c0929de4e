# Key-tiled attention against the standard path, and the streaming encoder against the full
# forward, inside MicroPython (and CPython): prints one line per check with its relative error.
#   MICROPYPATH=lib:board:board/demos:board/benchmarks:tests/mp micropython tests/mp/longseq_mp.py [backend]
import sys

import microformer as mf
from microformer.tensor import Rng, Tensor


def data(shape, seed):
    r = Rng(seed)
    t = Tensor(shape)
    for i in range(t.size):
        t.data[i] = r.signed_unit()
    return t


def rel(a, b):
    top = 1e-6
    err = 0.0
    for i in range(len(b)):
        if abs(b[i]) > top:
            top = abs(b[i])
        if abs(a[i] - b[i]) > err:
            err = abs(a[i] - b[i])
    return err / top


def tiled_vs_standard(causal, lengths, tile):
    B, S, E, H = 2, 11, 8, 2
    out = []
    for kv_tile in (None, tile):
        mf.seed(5)
        a = mf.Attention(E, H, causal=causal, kv_tile=kv_tile)
        y = a.forward(data((B, S, E), 1), lengths=lengths)
        dx = a.backward(data((B, S, E), 2))
        out.append([list(y.data), list(dx.data), list(a.dWq.data), list(a.dWk.data), list(a.dWv.data)])
    return max(rel(out[1][i], out[0][i]) for i in range(5))


def stream_vs_full():
    # causal layers and a window >= the whole stream: the streamed outputs are the full forward's
    mf.seed(6)
    model = mf.Sequential([mf.PositionalEncoding(32, 8), mf.EncoderBlock(8, 2, 16, causal=True),
                           mf.EncoderBlock(8, 2, 16, causal=True)])
    x = data((2, 10, 8), 3)
    full = list(model.forward(x).data)
    enc = mf.StreamingEncoder(model, 16, 4)
    got = [0.0] * len(full)
    p = 0
    for c in (4, 3, 1, 2):
        xc = Tensor((2, c, 8))
        for b in range(2):
            for t in range(c):
                for e in range(8):
                    xc.data[(b * c + t) * 8 + e] = x.data[(b * 10 + p + t) * 8 + e]
        y = enc.step(xc)
        for b in range(2):
            for t in range(c):
                for e in range(8):
                    got[(b * 10 + p + t) * 8 + e] = y.data[(b * c + t) * 8 + e]
        p += c
    return rel(got, full)


def main(backend):
    mf.set_backend(backend)
    for causal, lengths, tile in ((0, None, 4), (1, None, 3), (0, [11, 6], 5), (1, [7, 11], 1)):
        print("tiled causal=%d lengths=%s tile=%d rel %.3g" % (causal, lengths, tile,
                                                              tiled_vs_standard(causal, lengths, tile)))
    print("stream rel %.3g" % stream_vs_full())


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "python")
