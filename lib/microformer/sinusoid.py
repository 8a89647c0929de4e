# microformer.sinusoid: the sinusoidal positional table of "Attention Is All You Need", the one loop
# PositionalEncoding and the portable kernel posenc_table (kernels.py) run; it imports math only, so
# a layer can build its table without loading the portable kernels.
#   pe[p, 2i] = sin(p * div_i), pe[p, 2i+1] = cos(p * div_i), div_i = exp(-2i * ln(10000) / C)
from math import cos, exp, log, sin


def sinusoid(pe, L, C):
    # pe (L, C), float32: row p is position p's encoding
    k = -log(10000.0) / C
    for i in range(0, C, 2):
        div = exp(i * k)
        for p in range(L):
            a = p * div
            pe[p * C + i] = sin(a)
            if i + 1 < C:
                pe[p * C + i + 1] = cos(a)
