"""data.Batches: every batch holds the rows its order names (checked against the data set, epoch
after epoch), and a smaller last batch is a view on the full batches' buffer, not a block of its
own (a board's fit then holds one batch buffer: the gesture session's heap)."""
from array import array

from microformer.data import Batches, Dataset
from microformer.tensor import Rng, Tensor


def _data(n, F):
    X = Tensor((n, F))
    for i in range(n * F):
        X.data[i] = float(i)
    return Dataset(X, [i % 3 for i in range(n)], ["a", "b", "c"])


def test_batches_rows_and_the_last_batch_is_a_view():
    n, F, B = 10, 3, 4
    d = _data(n, F)
    it = Batches(d, B, Rng(7))
    for _ in range(3):
        seen = []
        full = None
        for X, y in it:
            rows = X.shape[0]
            assert X.shape == (rows, F) and len(y) == rows
            k = len(seen)
            for r in range(rows):
                i = it.order[k + r]
                assert list(X.data[r * F:(r + 1) * F]) == [float(i * F + c) for c in range(F)]
                assert y[r] == d.y[i]
            seen.extend(it.order[k:k + rows])
            if rows == B:
                full = X
            else:
                assert rows == n % B
                assert isinstance(X.data, memoryview), "the last batch has a buffer of its own"
                # the view is on the full batches' buffer: a write through one shows in the other
                X.data[0] = -1.0
                assert full.data[0] == -1.0
        assert sorted(seen) == list(range(n))
    assert isinstance(full.data, array)


def test_micro_batches_copy_their_rows_one_micro_batch_at_a_time():
    # a fit in micro-batches of rows large enough (data.gathers_batch) copies each micro-batch's
    # rows (in the batches' order) into a buffer of micro-batch rows; no buffer of the whole
    # batch's rows is made
    import microformer as mf
    from microformer.data import LAZY_ROWS, gathers_batch
    from microformer.train import Trainer
    n, F, B, m = 12, 300, 8, 2
    assert not gathers_batch(B, m, F) and (B - m) * F > LAZY_ROWS
    assert gathers_batch(B, m, 3) and gathers_batch(B, None, F) and gathers_batch(B, B, F)
    d = _data(n, F)
    mf.seed(1)
    model = mf.Sequential([mf.Dense(F, 4), mf.Dense(4, 3)])
    seen = []
    forward = model.forward

    def spy(x):
        seen.append((type(x.data), x.shape, list(x.data)))
        return forward(x)
    model.forward = spy
    t = Trainer(model, mf.CrossEntropyLoss(), None, batch_size=B, micro_batch=m)
    made = []
    real = Tensor.__init__

    def count(self, shape, data=None, name=None):
        if data is None and len(shape) == 2 and shape[0] == B and shape[1] == F:
            made.append(shape)
        real(self, shape, data, name)
    Tensor.__init__ = count
    try:
        t.fit(d, epochs=1, seed=4, verbose=False)
    finally:
        Tensor.__init__ = real
    assert not made, "a buffer of the whole batch's rows was made: %r" % made
    order = list(range(n))
    Rng(5).shuffle(order)                     # the fit's Batches: Rng(seed + 1)
    assert len(seen) == (B // m) + ((n - B) // m)
    for i, (kind, shape, rows) in enumerate(seen):
        assert kind is array and shape == (m, F)
        want = []
        for r in order[i * m:(i + 1) * m]:
            want.extend(float(r * F + c) for c in range(F))
        assert rows == want, "micro-batch %d holds other rows" % i
