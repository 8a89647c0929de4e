# A model made with the seeded init leaves the heap in one piece: its arrays land next to each
# other, not each after the garbage its predecessor's draws left (tests/mp/test_init_layout.py).
import gc
import sys

import microformer as mf
from microformer import lora, tensor


def largest():
    # the largest bytearray the heap can give now (bisection to 4 KB)
    gc.collect()
    lo, hi = 0, gc.mem_free()
    while hi - lo > 4096:
        mid = (lo + hi) // 2
        try:
            bytearray(mid)
            lo = mid
        except MemoryError:
            hi = mid
        gc.collect()
    return lo


if "off" in sys.argv[1:]:
    tensor.SETTLE_FLOATS = 10 ** 9      # the init without its collection, for comparison
if "lora-off" in sys.argv[1:]:
    lora.settle_gc = lambda: None       # add_lora without its GC threshold, for comparison
mf.seed(3)
model = mf.Sequential([mf.Dense(6, 64), mf.LearnedPositionalEmbedding(32, 64), mf.EncoderBlock(64, 4, 256),
                       mf.EncoderBlock(64, 4, 256), mf.GlobalAvgPool(), mf.Conv1D(64, 8, 3)])
gc.collect()
print("FREE %d LARGEST %d" % (gc.mem_free(), largest()))
# adapters added: every adapter next to the last, not above the garbage the last one left
lora.add_lora(model, rank=4, alpha=8, targets=("attention", "ffn"))
model.layers[-1].trainable = True
gc.collect()
print("LORA FREE %d LARGEST %d" % (gc.mem_free(), largest()))
