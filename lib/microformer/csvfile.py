# microformer.csvfile: the CSV reader of labelled rows (read_rows, read_csv, find_file), which
# microformer.data names too. Its own module: a board session needs it only while it loads, and
# lets it go then (board/mf_session.py LOAD_ONLY); its next use imports it again.
from array import array

from .data import Dataset
from .finite import NonFiniteError
from .tensor import Tensor


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
