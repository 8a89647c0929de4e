# microformer.viper_rows: the row kernels of the training and decoding loops: a batch's rows
# gathered from the data (gather_rows) and a row's largest value (argmax: the predicted class, the
# next token of greedy decoding). A module of their own, so that a model without sequence layers
# does not load viper_sequence for them. Bits are copied and compared as ints: no float is boxed.
import micropython


@micropython.viper
def _argmax(buf, off: int, n: int) -> int:
    # values compared as sign-magnitude ints (inf above every finite value, -0 == +0); NaN is
    # never larger, and a NaN first element stays the answer, as with float `>` comparisons
    p = ptr32(buf)
    x = p[off]
    if ((x >> 23) & 0xFF) == 255 and (x & 0x7FFFFF) != 0:
        return 0
    best = 0
    bk = x & 0x7FFFFF | (((x >> 23) & 0xFF) << 23)
    if (x >> 31) & 1:
        bk = 0 - bk
    for i in range(1, n):
        x = p[off + i]
        e = (x >> 23) & 0xFF
        if e == 255 and (x & 0x7FFFFF) != 0:
            continue
        k = (x & 0x7FFFFF) | (e << 23)
        if (x >> 31) & 1:
            k = 0 - k
        if k > bk:
            bk = k
            best = i
    return best


def argmax(buf, off, n):
    # index i < n of the largest buf[off + i], the first one on ties (exact: no float is boxed)
    return _argmax(buf, off, n)


@micropython.viper
def _gather(dst, src, idx, start: int, B: int, F: int):
    pd = ptr32(dst)
    ps = ptr32(src)
    o = 0
    for k in range(B):
        i = int(idx[start + k]) * F
        for f in range(F):
            pd[o + f] = ps[i + f]
        o += F


@micropython.viper
def gather_rows(dst, src, idx, start: int, B: int, F: int):
    # dst (B, F): row k = src row idx[start + k] (idx a list of row numbers), as raw bits
    _gather(dst, src, idx, start, B, F)
