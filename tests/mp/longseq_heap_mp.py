# Long sequences in little memory: one Attention(E, H) forward + backward over [1, S, E], the
# standard path (kv_tile=0 on the command line: the [B,H,S,S] weights stored) or the key-tiled one.
# Prints the live heap (gc.mem_alloc after gc.collect) after building, after forward, after backward,
# and the largest of them minus the start: the layer's buffers. Runs under MicroPython and CPython.
#   MICROPYPATH=lib micropython -X heapsize=3M tests/mp/longseq_heap_mp.py S E H TILE [backend]   (TILE 0: standard)
import gc
import sys
import time

import microformer as mf  # noqa: E402
from microformer.tensor import Rng, Tensor  # noqa: E402


def alloc():
    gc.collect()
    return gc.mem_alloc() if hasattr(gc, "mem_alloc") else 0


def _ms():
    return time.ticks_ms() if hasattr(time, "ticks_ms") else int(time.time() * 1000)


def _diff(a, b):
    return time.ticks_diff(a, b) if hasattr(time, "ticks_diff") else a - b


def main(argv):
    S, E, H, tile = int(argv[1]), int(argv[2]), int(argv[3]), int(argv[4])
    if len(argv) > 5:
        mf.set_backend(argv[5])
    base = alloc()
    mf.seed(7)
    attn = mf.Attention(E, H, kv_tile=tile or None)
    r = Rng(11)
    x = Tensor((1, S, E))
    dy = Tensor((1, S, E))
    for i in range(S * E):
        x.data[i] = r.uniform(-1.0, 1.0)
        dy.data[i] = r.uniform(-1.0, 1.0)
    built = alloc() - base
    t0 = _ms()
    y = attn.forward(x)
    fwd = alloc() - base
    t1 = _ms()
    dx = attn.backward(dy)
    t2 = _ms()
    bwd = alloc() - base
    sy = 0.0
    sdx = 0.0
    for i in range(S * E):
        sy += y.data[i]
        sdx += dx.data[i]
    print("heap S=%d E=%d H=%d kv_tile=%d backend=%s: built %d, after forward %d, after backward %d, peak %d bytes"
          % (S, E, H, tile, mf.get_backend(), built, fwd, bwd, max(built, fwd, bwd)))
    print("time forward %d ms, backward %d ms" % (_diff(t1, t0), _diff(t2, t1)))
    print("checksum y %.6g dx %.6g dWq %.6g" % (sy, sdx, sum(attn.dWq.data[i] for i in range(E * E))))


main(sys.argv)
