# microformer.data: small labelled datasets held as one float32 Tensor [N,F] plus int labels.
from array import array

from . import backend
from .finite import NonFiniteError, check_rows
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


def _is_number(text):
    try:
        float(text)
        return True
    except ValueError:
        return False


def read_rows(path, classes=None, header=None, num_features=None, who="read_csv"):
    """The CSV reader (read_csv and board/finetune.py use it): rows of float features with the
    label name last -> (features array('f') flat [N*F], labels [N], classes, feature names).

    header: None (detect: the first line is a header when one of its feature fields is not a
    number, else it is a data row), True (required), False (none). classes: the allowed label
    names in index order (None: first-seen order). num_features: the expected F.
    Blank lines and '#' comments are skipped. Every fault raises an error naming the file and
    the line (and the column): a line that is not UTF-8, a field that is not a number, a NaN / inf reading (judged as
    float32, so 1e39 is refused), a row with another field count than the header, an empty or
    unknown label, a missing file (OSError).
    """
    try:
        f = open(path, "rb")            # lines decoded one by one: an error names its line
    except OSError as e:
        code = e.args[0] if e.args and isinstance(e.args[0], int) else 0
        raise OSError(code, "%s: %s %r" % (who, "no such file:" if code == 2 else "cannot open", path))
    feats = array("f")
    labels = []
    fixed = bool(classes)
    classes = list(classes) if classes else []
    names = None
    F = num_features
    first = True
    with f:
        lineno = 0
        for line in f:
            lineno += 1
            try:
                line = line.decode()
            except UnicodeError:
                raise ValueError("%s: %s line %d is not UTF-8 text (%r)" % (who, path, lineno, bytes(line[:40])))
            line = line.strip()
            if not line or line[0] == "#":
                continue
            parts = line.split(",")
            if first:
                first = False
                numeric = True
                for p in parts[:-1]:
                    if not _is_number(p):
                        numeric = False
                        break
                if header is True and numeric:
                    raise ValueError("%s: %s line %d looks like data (its features are numbers), expected a "
                                     "header line; read the file with header=False" % (who, path, lineno))
                if header is True or (header is None and not numeric):
                    names = [p.strip() for p in parts[:-1]]
                    if F is not None and len(names) != F:
                        raise ValueError("%s: %s line %d: the header names %d features, expected %d"
                                         % (who, path, lineno, len(names), F))
                    F = len(names)
                    continue
            if F is None:
                F = len(parts) - 1
            if len(parts) != F + 1:
                raise ValueError("%s: %s line %d has %d fields, expected %d (%d features and a label): %r"
                                 % (who, path, lineno, len(parts), F + 1, F, line))
            name = parts[-1].strip()
            if not name:
                raise ValueError("%s: %s line %d: empty label (the last field must name the class)"
                                 % (who, path, lineno))
            if name not in classes:
                if fixed:
                    raise ValueError("%s: %s line %d: unknown label %r (expected one of %s)"
                                     % (who, path, lineno, name, ", ".join(classes)))
                classes.append(name)
            row = []
            for j in range(F):
                try:
                    row.append(float(parts[j]))
                except ValueError:
                    raise ValueError("%s: %s line %d, column %d (%s): %r is not a number"
                                     % (who, path, lineno, j + 1, names[j] if names else "x%d" % j,
                                        parts[j].strip()))
            row = array("f", row)
            for j in range(F):
                x = row[j]
                if x - x != 0.0:
                    raise NonFiniteError("%s: %s line %d, column %d (%s): %r is not finite as float32 "
                                     "(NaN and inf readings are refused)"
                                     % (who, path, lineno, j + 1, names[j] if names else "x%d" % j,
                                        parts[j].strip()))
            feats.extend(row)
            labels.append(classes.index(name))
    if names is None:
        names = ["x%d" % j for j in range(F or 0)]
    return feats, labels, classes, names


def read_csv(path, classes=None, header=None, num_features=None):
    """A labelled CSV file -> Dataset (see read_rows for the format and the errors)."""
    feats, labels, classes, names = read_rows(path, classes, header, num_features)
    if not labels:
        raise ValueError("read_csv: %s holds no data rows" % path)
    return Dataset(Tensor((len(labels), len(names)), feats), labels, classes, names)


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
        order = self.order
        labels = self.data.y
        for start in range(0, n, self.batch_size):
            B = min(self.batch_size, n - start)
            buf = self._bufs.get(B)
            if buf is None:
                buf = self._bufs[B] = (Tensor((B, F)), [0] * B)
            backend.K.gather_rows(buf[0].data, src, order, start, B, F)     # (row copies box no float)
            y = buf[1]
            for k in range(B):
                y[k] = labels[order[start + k]]
            yield buf                     # the kept (X, y): no new tuple per batch
