# DecoderBlock and Transformer: freezing a part, and buffer reuse (CPython and MicroPython):
#   MICROPYPATH=lib:tests/mp micropython tests/mp/decoder_buffers_mp.py [backend]
# Raises AssertionError on the first failure; prints DECODER OK at the end. LayerNorm and the
# residual add run portable kernels (they allocate floats), so a block's steady-state heap use is
# printed, not required to be 0: what is checked is that every buffer is reused.
import gc
import sys

import microformer as mf

MICRO = sys.implementation.name == "micropython"


def _x(shape, seed):
    rng = mf.Rng(seed)
    t = mf.Tensor(shape)
    for i in range(t.size):
        t.data[i] = rng.uniform(-1.0, 1.0)
    return t


def _model():
    mf.seed(3)
    return mf.Transformer(7, 6, 8, 2, 12, 1, 2, max_len=8)


SRC = [[1, 2, 3, 4], [5, 6, 0, 0]]
TGT = [[1, 2, 3], [1, 4, 0]]


def _step(model):
    for _, g in model.params():
        if g.data is not None:              # a frozen parameter has no grad buffer
            g.fill(0.0)
    y = model.forward(SRC, TGT, [4, 2], [3, 2])
    model.backward(_x(y.shape, 5))
    return [None if g.data is None else list(g.data) for _, g in model.params()]


def check_freeze():
    ref = _model()
    want = _step(ref)
    m = _model()
    frozen = [m.decoder[1].cross_attn, m.encoder[0].ffn, m.src_embed, m.decoder[0]]
    for part in frozen:
        part.trainable = False
    ids = {}
    for part in frozen:
        for p, _ in part.params():
            ids[id(p)] = 1
    collected = [id(p) for p, _ in m.parameters()]
    assert all(i not in ids for i in collected), "a frozen parameter was collected"
    assert len(collected) == len(m.params()) - len(ids), "a trainable parameter was not collected"
    got = _step(m)
    k = 0
    for p, g in m.params():
        if id(p) in ids:
            assert got[k] is None, "frozen %s has a grad buffer" % p.name
        else:
            err = max(abs(a - b) for a, b in zip(got[k], want[k])) if got[k] else 0.0
            assert len(got[k]) == len(want[k]) and err <= 1e-6, "%s: grad differs by %g" % (p.name, err)
        k += 1
    assert all(not part.trainable for part in frozen) and m.trainable, "a trainable flag changed"
    print("freeze ok")


def _alloc(fn):
    if not MICRO:
        return None
    gc.collect()
    gc.disable()
    try:
        a0 = gc.mem_alloc()
        fn()
        return gc.mem_alloc() - a0
    finally:
        gc.enable()


def check_block_buffers(backend):
    mf.seed(4)
    blk = mf.DecoderBlock(8, 2, 12, activation="relu")
    x, m, dy = _x((2, 3, 8), 1), _x((2, 4, 8), 2), _x((2, 3, 8), 3)
    y = blk.forward(x, m, memory_lengths=[4, 2])
    dx = blk.backward(dy)
    dm = blk.dmemory
    first = (list(y.data), list(dx.data), list(dm.data))
    y2 = blk.forward(x, m, memory_lengths=[4, 2])
    dx2 = blk.backward(dy)
    dm2 = blk.dmemory
    assert y2 is y and dx2 is dx and dm2 is dm, "a second step at the same shape allocated new buffers"
    assert (list(y2.data), list(dx2.data), list(dm2.data)) == first, "the same input gave other values"
    y3 = blk.forward(_x((1, 2, 8), 6), _x((1, 4, 8), 7))
    assert y3.shape == (1, 2, 8)
    y4 = blk.forward(x, m, memory_lengths=[4, 2])
    dx4 = blk.backward(dy)
    dm4 = blk.dmemory
    assert (list(y4.data), list(dx4.data), list(dm4.data)) == first, "back to the first shape: other values"

    def step():
        blk.forward(x, m, None, None, None, LENGTHS)
        blk.backward(dy)
    alloc = _alloc(step) if backend == "viper" else None
    # cached decoding: one step at a steady shape
    blk.cache_memory(m, memory_lengths=[4, 2])
    blk.prefill(_x((2, 1, 8), 8), max_len=6)
    t = _x((2, 1, 8), 9)
    a = blk.decode_step(t)
    a_again = blk.decode_step(t)
    assert a_again is a, "decode_step allocated a new output"
    dec_alloc = _alloc(lambda: blk.decode_step(t)) if backend == "viper" else None
    print("block buffers ok (steady-state alloc %s, decode step alloc %s)" % (alloc, dec_alloc))
    return alloc, dec_alloc


LENGTHS = [4, 2]


def main(backend):
    mf.set_backend(backend)
    check_freeze()
    alloc, dec_alloc = check_block_buffers(backend)
    print("DECODER OK %s %s" % (alloc, dec_alloc))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "python")
