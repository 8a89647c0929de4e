# DecoderBlock(dropout=p)'s masks from one seed, printed so that CPython and every MicroPython port
# can be compared line by line (tests/mp/test_decoder_dropout.py); also checks eval() is the dropout=0
# block bit for bit.
#   MICROPYPATH=lib:board:board/demos:board/benchmarks:tests/mp micropython tests/mp/decoder_dropout_mp.py [backend]
import sys

import microformer as mf
from dropout_mp import bits, data


def main(backend):
    mf.set_backend(backend)
    mf.seed(31)
    blk = mf.DecoderBlock(8, 2, 16, dropout=0.3)
    mf.seed(31)
    plain = mf.DecoderBlock(8, 2, 16)
    x = data((2, 5, 8), 5)
    m = data((2, 3, 8), 6)
    blk.forward(x, m)
    print("self_attn keep", bits(blk.self_attn._keep, 2 * 2 * 5 * 5))
    print("drop1", bits(blk.drop1.mask(), 80))
    print("cross_attn keep", bits(blk.cross_attn._keep, 2 * 2 * 5 * 3))
    print("drop2", bits(blk.drop2.mask(), 80))
    print("ffn drop", bits(blk.ffn.drop.mask(), 160))
    print("drop3", bits(blk.drop3.mask(), 80))
    blk.backward(data((2, 5, 8), 7))
    dm = blk.dmemory
    print("dmemory zeros", len([i for i in range(48) if dm.data[i] == 0.0]))
    blk.eval()
    y = blk.forward(x, m)
    yp = plain.forward(x, m)
    assert list(y.data) == list(yp.data), "eval DecoderBlock(dropout) differs from dropout=0"
    print("eval identity ok")


main(sys.argv[1] if len(sys.argv) > 1 else "python")
