# microformer.data: small labelled datasets held as one float32 Tensor [N,F] plus int labels.

from . import backend
from .finite import check_rows
from .lazy import sibling
from .tensor import Rng, Tensor, zeros


class Dataset:
    """X: Tensor [N,F]; y: list of N ints in [0, len(classes)); classes: label names (default
    0..max(y)); features: the F feature names (default x0, x1, ...).

    Refuses a NaN / +-inf in X (NonFiniteError naming the example and the feature) and a label
    outside [0, len(classes)).
    """

    def __init__(self, X, y, classes=None, features=None):
        if not isinstance(X, Tensor):
            raise ValueError("Dataset: X must be a Tensor [N,F], got %s" % type(X).__name__)
        if len(X.shape) != 2 or X.shape[0] != len(y):
            raise ValueError("Dataset: X must be [N,F] with N = len(y) = %d, got %r" % (len(y), X.shape))
        N, F = X.shape
        y = list(y)
        if classes is None:
            top = -1
            for v in y:
                if isinstance(v, int) and v > top:
                    top = v
            classes = list(range(top + 1))
        classes = list(classes)
        C = len(classes)
        for i in range(N):
            v = y[i]
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < C:
                raise ValueError("Dataset: the label at index %d must be an int in [0, %d) (classes %s), got %r"
                                 % (i, C, ", ".join(str(c) for c in classes), v))
        if features is not None and len(features) != F:
            raise ValueError("Dataset: features must name the F=%d columns, got %r" % (F, features))
        check_rows("Dataset", X.data, F, features)
        self.X = X
        self.y = y
        self.classes = classes
        self.features = list(features) if features is not None else ["x%d" % j for j in range(F)]

    def __len__(self):
        return len(self.y)

    @property
    def num_features(self):
        return self.X.shape[1]

    def row(self, i):
        F = self.X.shape[1]
        return [self.X.data[i * F + j] for j in range(F)]

    def subset(self, idx):
        F = self.X.shape[1]
        out = zeros(F * len(idx))
        src = self.X.data
        for k, i in enumerate(idx):
            out[k * F:(k + 1) * F] = src[i * F:(i + 1) * F]
        return Dataset(Tensor((len(idx), F), out), [self.y[i] for i in idx], self.classes, self.features)

    def split(self, n_first, seed=0):
        """A seeded shuffle, then the first n_first rows and the rest."""
        if not (0 < n_first < len(self)):
            raise ValueError("Dataset.split: n_first must be in 1..%d, got %r" % (len(self) - 1, n_first))
        idx = Rng(seed).shuffle(list(range(len(self))))
        return self.subset(idx[:n_first]), self.subset(idx[n_first:])

    def stats(self):
        """Per-feature mean and standard deviation (lists)."""
        N, F = self.X.shape
        d = self.X.data
        mean = [0.0] * F
        var = [0.0] * F
        for i in range(N):
            for j in range(F):
                mean[j] += d[i * F + j]
        mean = [m / N for m in mean]
        for i in range(N):
            for j in range(F):
                e = d[i * F + j] - mean[j]
                var[j] += e * e
        return mean, [(v / N) ** 0.5 or 1.0 for v in var]

    def standardize(self, mean, std):
        """In place: x = (x - mean) / std per feature."""
        N, F = self.X.shape
        d = self.X.data
        for i in range(N):
            for j in range(F):
                d[i * F + j] = (d[i * F + j] - mean[j]) / std[j]
        return self


# The CSV reader (read_rows, read_csv, find_file) lives in microformer.csvfile, imported when one
# of them is first asked for here; not bound into this module, so that a program that drops
# csvfile once it has read its files (the board session) gets its heap back.
_CSV = ("find_file", "read_rows", "read_csv")


def __getattr__(name):
    if name in _CSV:
        return getattr(sibling("csvfile", "microformer.data." + name), name)
    raise AttributeError("module '%s' has no attribute '%s'" % (__name__, name))


class Batches:
    """Iterates (X [B,F], labels) over a Dataset, reusing one buffer per batch size (a smaller last
    batch: a view on the full batches' buffer). A batch is valid until the next one is drawn.
    gather=False: X is a BatchRows (which rows of the data, not copied), for a trainer that copies
    a micro-batch's rows at a time (train.Trainer) instead of the whole batch's."""

    def __init__(self, data, batch_size, rng=None, gather=True):
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError("Batches: batch_size must be a positive int, got %r" % (batch_size,))
        self.data = data
        self.batch_size = batch_size
        self.rng = rng
        self.gather = gather
        self.order = list(range(len(data)))
        self._bufs = {}

    def __iter__(self):
        if self.rng is not None:
            self.rng.shuffle(self.order)
        n = len(self.order)
        F = self.data.X.shape[1]
        src = self.data.X.data
        order = self.order
        labels = self.data.y
        for start in range(0, n, self.batch_size):
            B = min(self.batch_size, n - start)
            buf = self._bufs.get(B)
            if buf is None:
                buf = self._bufs[B] = self._new(B, F)
            if self.gather:
                backend.K.gather_rows(buf[0].data, src, order, start, B, F)     # (row copies box no float)
            else:
                buf[0].start = start
            y = buf[1]
            for k in range(B):
                y[k] = labels[order[start + k]]
            yield buf                     # the kept (X, y): no new tuple per batch

    def _new(self, B, F):
        # the (X, y) of batches of B rows: a smaller last batch's X is a view on the first rows of
        # the full batches' buffer (read only until the next batch is drawn), not a block of its own
        if not self.gather:
            return (BatchRows(self.data.X.data, self.order, B, F), [0] * B)
        full = self._bufs.get(self.batch_size)
        if full is not None and B < self.batch_size:
            return (Tensor((B, F), memoryview(full[0].data)[:B * F]), [0] * B)
        return (Tensor((B, F)), [0] * B)


class BatchRows:
    """The rows of a batch, not copied: rows order[start .. start + B) of the data src [N, F]
    (Batches(gather=False)); data is None (it is no Tensor). gather(dst, s, k) copies k of them,
    from the batch's row s, into dst [k, F]."""

    def __init__(self, src, order, B, F):
        self.src = src
        self.order = order
        self.start = 0
        self.shape = (B, F)
        self.size = B * F
        self.data = None

    def gather(self, dst, s, k):
        backend.K.gather_rows(dst, self.src, self.order, self.start + s, k, self.shape[1])


# A fit in micro-batches copies one micro-batch's rows at a time (data.BatchRows) when the rows of
# the batch beyond one micro-batch hold more than LAZY_ROWS floats (the gesture model's 16 windows
# of 150 floats: 9 KB less in micro-batches of 1); below that one buffer of the whole batch's rows
# costs less than the micro-batches' own buffers, made again when a step halves the micro-batch
# (Iris, 4 floats a row: its session needed 214 KB instead of 211 KB copying per micro-batch, 32-bit port)
LAZY_ROWS = 1024


def gathers_batch(B, micro, F):
    """Does a fit of batches of B rows of F floats in micro-batches of `micro` rows (None: the whole
    batch) copy each batch's rows whole (True), or one micro-batch's at a time (False)?"""
    return not (micro and micro < B and (B - micro) * F > LAZY_ROWS)
