# Buffer switches cut short: the Iris fit loop (batches of 16 and the last one of 8, an evaluate at
# batch 32 between epochs) with a KeyboardInterrupt raised inside a buffer switch, at the k-th
# buffer a layer asks for (Buffers.zeros / bytes / ints / view / none) or the k-th buffer it
# zeroes, for every k a run has. Each interrupted step is run again; at the end the weights,
# moments and step count must equal those of the run without interrupts, bit for bit.
#   micropython tests/mp/fit_heap_mp.py BACKEND
# A long fit of a Session (thousands of epochs of one step) holds, records and saves a bounded
# history: LONGFIT lines (one per fit length) give the heap the result and the record hold.
#   micropython -X heapsize=512K tests/mp/fit_heap_mp.py longfit BACKEND FLASH_DIR EPOCHS...
import sys
from array import array

import microformer as mf
from microformer import backend
from microformer.layer import Buffers
from microformer.data import Batches
from microformer.models import iris_model, iris_split
from microformer.train import evaluate, train_step

_ASKS = ("zeros", "bytes", "ints", "view", "none")
_asks = dict((n, getattr(Buffers, n)) for n in _ASKS)
_count = [0, 0, False]  # calls seen; the call that raises (0: none); counting on (inside a step or an evaluate)


def _counted():
    if _count[2]:
        _count[0] += 1
        if _count[0] == _count[1]:
            raise KeyboardInterrupt


def _counted_ask(name):
    ask = _asks[name]

    def counted(self, *args):
        _counted()
        return ask(self, *args)
    return counted


def _hook(on):
    for n in _ASKS:
        setattr(Buffers, n, _counted_ask(n) if on else _asks[n])


class _Zeroing:
    """The backend's kernels, with zero() counted (the buffers a switch clears)."""

    def __init__(self, k):
        self.k = k

    def __getattr__(self, name):
        return getattr(self.k, name)

    def zero(self, buf, n):
        _counted()
        self.k.zero(buf, n)


def state(model, opt):
    out = [bytes(p.data) for _, p in model.named_params()]
    for t in opt.m + opt.v:
        out.append(bytes(t.data))
    return out


def logits(model, X):
    # the model's output for X (not counted): the same before an interrupted step and after it
    model.eval()
    out = bytes(model.forward(X).data)
    model.train()
    return out


def run(train, test, at):
    """(state, steps, interrupts, calls) of 2 epochs with the `at`-th counted call raising. After
    an interrupt, the model's output for the batch before (whose shape the interrupted switch
    came from) must be what it was before the interrupted step."""
    _count[0] = 0
    _count[1] = at
    model = iris_model(1)
    opt = mf.Adam(model, lr=1e-2)
    lf = mf.CrossEntropyLoss()
    batches = Batches(train, 16, mf.Rng(2))
    interrupts = 0
    prev = None
    for epoch in range(2):
        for X, y in batches:
            ref = logits(model, prev) if prev is not None else None
            while True:
                s0 = opt.steps
                try:
                    _count[2] = True        # counted inside the step only (not the batches' own arrays)
                    train_step(model, lf, opt, X, y)
                    break
                except KeyboardInterrupt:
                    interrupts += 1
                    _count[2] = False
                    assert opt.steps == s0, "an interrupt inside a buffer switch counted a step"
                    if prev is not None:
                        assert logits(model, prev) == ref, \
                            "after an interrupt, the output for the batch before differs"
            _count[2] = False
            prev = mf.Tensor(X.shape, array("f", X.data))
        while True:
            try:
                _count[2] = True
                evaluate(model, test)
                break
            except KeyboardInterrupt:
                interrupts += 1
            finally:
                _count[2] = False
    return state(model, opt), opt.steps, interrupts, _count[0]


def main():
    mf.set_backend(sys.argv[1])
    train, test, _, _ = iris_split()
    assert len(train) % 16, "the training split must end with a partial batch"
    want, steps, n, calls = run(train, test, 0)
    assert n == 0
    kernels = backend.K
    for kind in ("draw", "zero"):
        if kind == "draw":
            _hook(True)
        else:
            backend.K = _Zeroing(kernels)
        try:
            _, _, _, total = run(train, test, 0)
            assert total > 0, "no %s counted" % kind
            for k in range(1, total + 1):
                got, st, n, _ = run(train, test, k)
                assert n == 1, "%s %d of %d: %d interrupts raised" % (kind, k, total, n)
                assert st == steps, "%s %d: %d steps, expected %d" % (kind, k, st, steps)
                assert got == want, "%s %d of %d: the weights or moments differ from the run without interrupts" % (
                    kind, k, total)
        finally:
            _hook(False)
            backend.K = kernels
        print("SWITCH", kind, total, steps)


def longfit(backend_name, root, lengths):
    import gc
    import json
    import trust_data_mp
    finetune = trust_data_mp.make_flash(root)
    s = finetune.Session(root=root, verbose=False, backend=backend_name, batch_size=8)
    rows = [[float(v) for v in r.split(",")[:4]] for r in trust_data_mp.ROWS]
    pairs = []
    for i in range(8):
        x = rows[i % len(rows)]
        pairs.append(([x[0] + 0.1 * i, x[1], x[2], x[3]], trust_data_mp.CLASSES[i % 3]))
    s.add_examples(pairs)
    h = None
    for epochs in lengths:
        h = None
        gc.collect()
        a0 = gc.mem_alloc()
        # the user's 8 examples, batch 8: a step an epoch (rehearse=0: no base rows replayed;
        # the validation after every epoch stays)
        h = s.fit(epochs=epochs, verbose=False, rehearse=0)
        gc.collect()
        held = gc.mem_alloc() - a0
        meta_bytes = len(json.dumps(s.meta["history"])) + len(json.dumps(s.meta["fit_totals"]))
        print("LONGFIT", epochs, h.epochs, h.steps, len(h), h[0]["epoch"], h[-1]["epoch"], held,
              len(s.meta["history"]), meta_bytes, int(h.interrupted))
    h = None
    gc.collect()
    s.save()
    t = finetune.Session(root=root, verbose=False, backend=backend_name)
    tot = t.meta["fit_totals"]
    print("SAVED", tot["fits"], tot["epochs"], tot["steps"], len(t.meta["history"]))


if sys.argv[1] == "longfit":
    longfit(sys.argv[2], sys.argv[3], [int(a) for a in sys.argv[4:]])
else:
    main()
