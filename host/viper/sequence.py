# microformer.viper_sequence: the elementwise kernels of sequence models: the residual add, the
# sinusoidal positions added to the tokens, the embedding lookup (and its gradient), the KV-cache
# store. Float adds are done on the raw bits (snippet `fadd`).
import micropython


# ERROR BOUND (add_forward, posenc_forward, embedding_backward, posembed_backward;
#   tests/mp/test_viper_range.py, tests/mp/test_viper_decode_range.py): each
#   sum is the float32 sum, bit for bit (round to nearest, ties to even), except that subnormal
#   operands count as 0 and a sum below 2^-126 is flushed to 0 (an absolute error below 2^-126);
#   inf and NaN as IEEE. The embedding lookup and the KV store copy bits.
@micropython.viper
def _add(out, a, b, n: int, boff: int, bwrap: int):
    # out[i] = a[i] + b[boff + i % bwrap] for i < n (out may be a or b); bwrap = n: a plain add
    po = ptr32(out)
    pa = ptr32(a)
    pb = ptr32(b)
    j = 0
    for i in range(n):
        xa = pa[i]
        xb = pb[boff + j]
        j += 1
        if j == bwrap:
            j = 0
        fadd(po, i, xa, xb)


def add_forward(out, a, b, n):
    # out (n,) = a (n,) + b (n,)   (a residual connection; out may be a or b)
    _add(out, a, b, n, 0, n)


@micropython.viper
def posenc_forward(out, inp, pe, B: int, S: int, C: int, start: int):
    # out (B, S, C) = inp (B, S, C) + pe[start + s] (pe (L, C), L >= start + S)
    # (this entry point and the others of 5 or more arguments below are viper functions: as
    # bytecode their frames (13-15 words) came from the GC heap on every call)
    _add(out, inp, pe, B * S * C, start * C, S * C)


@micropython.viper
def posembed_backward(dtable, dout, B: int, S: int, C: int, start: int):
    # dtable (L, C): rows start .. start + S - 1 += dout (B, S, C) summed over B in order (the
    # learned positions' gradient; accumulated)
    pt = ptr32(dtable)
    po = ptr32(dout)
    ob = 0
    for b in range(B):
        tb = start * C
        for k in range(S * C):
            xa = pt[tb + k]
            xb = po[ob + k]
            fadd(pt, tb + k, xa, xb)
        ob += S * C


@micropython.viper
def _token(ids, n: int, V: int) -> int:
    # the token id ids[n] (float32), or -1 unless it is an int in [0, V) (the array and index are
    # passed, not the bits: an int of 2^30 or more would be boxed on the heap for the call)
    x = ptr32(ids)[n]
    e = (x >> 23) & 0xFF
    if e == 0 and (x & 0x7FFFFF) == 0:
        return 0                            # 0.0 and -0.0
    if (x >> 31) & 1 or e < 127 or e > 150 + 7:
        return 0 - 1                        # negative, below 1 (subnormals too), inf / NaN, huge
    m = (x & 0x7FFFFF) | 0x800000
    if e <= 150:
        sh = 150 - e
        if m & ((1 << sh) - 1):
            return 0 - 1                    # a fraction
        t = m >> sh
    else:
        t = m << (e - 150)
    if t >= V:
        return 0 - 1
    return t


@micropython.viper
def _embed(out, ids, table, N: int, C: int, V: int) -> int:
    # out (N, C) = table[ids]; the index of the first bad id (its row not written), or -1
    po = ptr32(out)
    pt = ptr32(table)
    ob = 0
    for n in range(N):
        t = int(_token(ids, n, V))
        if t < 0:
            return n
        tb = t * C
        for c in range(C):
            po[ob + c] = pt[tb + c]
        ob += C
    return 0 - 1


@micropython.viper
def _embed_back(dtable, dout, ids, N: int, C: int, V: int):
    # dtable (V, C) += dout (N, C) rows at ids (ids checked by the forward)
    pt = ptr32(dtable)
    po = ptr32(dout)
    ob = 0
    for n in range(N):
        t = int(_token(ids, n, V))
        if t >= 0:
            tb = t * C
            for c in range(C):
                xa = pt[tb + c]
                xb = po[ob + c]
                fadd(pt, tb + c, xa, xb)
        ob += C


@micropython.viper
def embedding_forward(out, ids, table, N: int, C: int, V: int):
    # ids (N,): token ids stored as floats; table (V, C); out (N, C) = table[ids]
    # returns -1, or the index of the first id that is not an int in [0, V) (that row is not written)
    return _embed(out, ids, table, N, C, V)


@micropython.viper
def embedding_backward(dtable, dout, ids, N: int, C: int):
    # dtable (V, C) += dout rows at ids (accumulated)
    _embed_back(dtable, dout, ids, N, C, int(len(dtable)) // C)


@micropython.viper
def _kv(cache, src, B: int, S: int, L: int, C: int, pos: int):
    pc = ptr32(cache)
    ps = ptr32(src)
    si = 0
    for b in range(B):
        ci = (b * L + pos) * C
        for k in range(S * C):
            pc[ci + k] = ps[si]
            si += 1


@micropython.viper
def kv_store(cache, src, B: int, S: int, L: int, C: int, pos: int):
    # cache (B, L, C)[:, pos:pos+S, :] = src (B, S, C), bit for bit
    _kv(cache, src, B, S, L, C, pos)
