# tests/mp/viper_pieces_mp.py: the block-float GEMM (viper_gemm._gemm) with B's quantized rows held
# in pieces (an operand larger than the scratch cap _PIECE) against the same product computed whole
# (a scratch large enough for every row): bit for bit, for each product kind that can have many B
# rows (Dense forward with a bias, input gradient accumulated, weight gradient with the fused bias
# row falling in the last piece, attention scores); a large A operand keeps B whole; and the
# module scratch stays near the cap.
# Runs in MicroPython only (viper): prints PIECES ok N or raises.
from array import array

from microformer import viper_common as vc
from microformer import viper_gemm as vg

CAP = 4096                          # ints: the 16 KB cap that viper_gemm._PIECE states

_seed = [12345]


def rand(n, scale=1.0):
    # floats in [-scale, scale): a small LCG (the same numbers on every port), spread over a few
    # binades so blocks have small elements next to large ones
    a = array("f", bytes(4 * n))
    s = _seed[0]
    for i in range(n):
        s = (s * 1103515245 + 12345) & 0x7FFFFFFF
        a[i] = ((s >> 8) / 4194304.0 - 1.0) * scale / (1 + (s & 7))
    _seed[0] = s
    return a


def bits(a):
    return bytes(a)


def run(kind, x, y, z, w, u, nout, na, nb, nbias):
    out0 = rand(nout)                               # the old output (an addend for _ADD_OLD)
    a = rand(na)
    b = rand(nb, 3.0)
    bias = rand(nbias) if nbias else out0
    res = []
    need = int(vg._gemm(0, 0, 0, array("f"), array("f"), array("f"), array("f"), array("i"),
                        kind, x, y, z, w, u))   # asked with no scratch: what the pieces take
    for whole in (True, False):
        out = array("f", out0)
        bb = array("f", bias) if nbias else out
        s = array("i", bytes(4 * (200000 if whole else need)))
        if whole:
            assert int(vg._gemm(0, 0, 0, out, a, b, bb, s, kind, x, y, z, w, u)) == 0
        else:
            assert int(vg._gemm(0, 0, 0, out, a, b, bb, s, kind, x, y, z, w, u)) == 0, "pieces asked for more"
        res.append((bits(out), bits(bb)))
    assert need <= CAP, "kind %d: the pieces take %d ints, over the cap %d" % (kind, need, CAP)
    assert res[0] == res[1], "kind %d %r: pieces differ from the whole product" % (kind, (x, y, z, w, u))
    return need


def main():
    n = 0
    # Dense forward with a bias: out (5, 80) = inp (5, 64) . W (80, 64)^T + b: 80 B rows of 64
    run(vg.MM_FORWARD, 5, 64, 80, 1, 0, 5 * 80, 5 * 64, 80 * 64, 80)
    n += 1
    # input gradient, accumulated: dinp (3, 80) += dout (3, 64) . W (64, 80): 80 B rows of 64
    run(vg.MM_DINP, 3, 80, 64, 1, 0, 3 * 80, 3 * 64, 64 * 80, 0)
    n += 1
    # weight gradient with the bias row fused: dW (3, 70) += dout^T . inp over 64 rows; 71 B rows
    run(vg.MM_DWEIGHT, 64, 70, 3, 1, 0, 3 * 70, 64 * 3, 64 * 70, 3)
    n += 1
    # attention scores: B = 1, Tq = 2, Tk = 300, C = 32, 2 heads of 16: 300 B rows of 16
    run(vg.HEAD_SCORES, 1, 2, 300, 32, 2, 2 * 2 * 300, 2 * 32, 300 * 32, 0)
    n += 1
    # an A operand of as many ints as B's rows take: B whole (80 rows of 64 and their exponents,
    # one A row, 80 decoded biases), no piece and no quantization of A again
    z = array("f")
    need = int(vg._gemm(0, 0, 0, z, z, z, z, array("i"), vg.MM_FORWARD, 100, 64, 80, 1, 0))
    assert need == 80 * 64 + 80 + 64 + 2 * 80, need
    n += 1
    # through matmul_forward (the module scratch, as a layer calls it): grown to the cap, not to
    # the operand (256 x 64 weight rows: 16,704 ints whole)
    vc._S[0] = array("i", bytes(4 * 64))
    out = array("f", bytes(4 * 4 * 256))
    vg.matmul_forward(out, rand(4 * 64), rand(256 * 64), rand(256), 4, 64, 256)
    cap = CAP + CAP // 4 + 16
    assert len(vc._S[0]) <= cap, "module scratch grew to %d ints (cap %d)" % (len(vc._S[0]), cap)
    n += 1
    print("PIECES ok %d" % n)


main()
