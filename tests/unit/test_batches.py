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
