# microformer.data: small labelled datasets held as one float32 Tensor [N,F] plus int labels.
from array import array

from .tensor import Rng, Tensor


class Dataset:
    """X: Tensor [N,F]; y: list of N ints in [0, len(classes)); classes: label names."""

    def __init__(self, X, y, classes=None):
        if len(X.shape) != 2 or X.shape[0] != len(y):
            raise ValueError("Dataset: X must be [N,F] with N = len(y) = %d, got %r" % (len(y), X.shape))
        self.X = X
        self.y = list(y)
        self.classes = list(classes) if classes is not None else sorted(set(self.y))

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
        out = array("f", bytes(4 * F * len(idx)))
        src = self.X.data
        for k, i in enumerate(idx):
            out[k * F:(k + 1) * F] = src[i * F:(i + 1) * F]
        return Dataset(Tensor((len(idx), F), out), [self.y[i] for i in idx], self.classes)

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


def find_file(name, path=None):
    """`path` if given, else the first of data/NAME (the board's flash), /data/NAME,
    datasets/NAME or ../datasets/NAME (a checkout) that exists."""
    candidates = (path,) if path else ("data/" + name, "/data/" + name, "datasets/" + name,
                                        "../datasets/" + name)
    for p in candidates:
        try:
            open(p).close()
            return p
        except OSError:
            pass
    raise OSError("%s not found (looked in %s)" % (name, ", ".join(candidates)))


def read_csv(path, classes=None, header=True):
    """Rows of float features with the label name last -> Dataset (classes in first-seen order)."""
    feats = array("f")
    labels = []
    classes = list(classes) if classes else []
    fixed = bool(classes)
    F = None
    with open(path) as f:
        for lineno, line in enumerate(f):
            line = line.strip()
            if not line or line.startswith("#") or (header and lineno == 0):
                continue
            parts = line.split(",")
            if F is None:
                F = len(parts) - 1
            if len(parts) != F + 1:
                raise ValueError("read_csv: %s line %d has %d fields, expected %d" % (path, lineno + 1, len(parts), F + 1))
            name = parts[-1].strip()
            if name not in classes:
                if fixed:
                    raise ValueError("read_csv: %s line %d: unknown class %r (expected one of %s)"
                                     % (path, lineno + 1, name, classes))
                classes.append(name)
            for p in parts[:-1]:
                feats.append(float(p))
            labels.append(classes.index(name))
    if F is None:
        raise ValueError("read_csv: %s holds no data rows" % path)
    return Dataset(Tensor((len(labels), F), feats), labels, classes)


class Batches:
    """Iterates (X [B,F], labels) over a Dataset, reusing one buffer per batch size."""

    def __init__(self, data, batch_size, rng=None):
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError("Batches: batch_size must be a positive int, got %r" % (batch_size,))
        self.data = data
        self.batch_size = batch_size
        self.rng = rng
        self.order = list(range(len(data)))
        self._bufs = {}

    def __iter__(self):
        if self.rng is not None:
            self.rng.shuffle(self.order)
        n = len(self.order)
        F = self.data.X.shape[1]
        src = self.data.X.data
        for start in range(0, n, self.batch_size):
            idx = self.order[start:start + self.batch_size]
            B = len(idx)
            buf = self._bufs.get(B)
            if buf is None:
                buf = self._bufs[B] = (Tensor((B, F)), [0] * B)
            X, y = buf
            for k in range(B):
                i = idx[k]
                X.data[k * F:(k + 1) * F] = src[i * F:(i + 1) * F]
                y[k] = self.data.y[i]
            yield X, y
