# microformer.meta: what a fine-tuning session needs from a checkpoint's metadata, checked in
# one place (host conversion, host pretraining, the board's Session all call check()).
#
#   key          type                         meaning (default when missing)
#   task         'classify' | 'regress'       what the head's outputs are ('classify')
#   classes      list of unique names         classify: the label of each output (required)
#   targets      list of unique names         regress: the name of each output (y0, y1, ...)
#   input_shape  [F] or [L, C]                one example: F flat features, or a window of L
#                                             readings of C channels, stored time-major as L*C
#                                             numbers in a CSV row ([len(mean)])
#   features     list of C names              the features (flat) or channels (window)
#                                             (x0, x1, ...)
#   mean, std    lists of C finite numbers    standardization per feature / channel, applied as
#                                             (x - mean) / std; std > 0 (0.0 / 1.0: raw inputs);
#                                             judged as float32 (1e39 is inf there, 1e-46 is 0)
#   data         str                          base data file on the board, under data/ (none)
#   split_seed   int                          shuffles the base data's rows (0)
#   n_train      int >= 0                     the first n_train shuffled rows are 'train', the
#                                             rest 'test' (80 % of the rows, rounded down)
#   split        {"test": [row, ...]} or      the model's own split, by 0-based data row: the
#                {"train": [row, ...]}        rows listed are that part, every other row the
#                                             other; nothing is shuffled (split_seed unused;
#                                             n_train, when given, must agree)
#
# A name (class, target, feature) is a non-empty str a CSV field holds as it is: no comma, double
# quote, newline or space at either end (add_example writes it into data/user.csv, and the
# reader must give the same name back).
# check(meta) raises MetaError (a ValueError) naming the key, what it must be and what it is;
# it returns the metadata with every default filled in, and a list of notes saying which keys
# were defaulted and what they are for (conversion prints them).
from array import array

TASKS = ("classify", "regress")
TRAIN_FRACTION = 0.8


class MetaError(ValueError):
    pass


def _err(where, key, want, got):
    return MetaError("%s: metadata %r must be %s, got %r" % (where, key, want, got))


def _is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and v not in (
        float("inf"), float("-inf"))


def _names(where, key, v, n=None):
    if not isinstance(v, (list, tuple)) or not v:
        raise _err(where, key, "a non-empty list of names", v)
    for s in v:
        if not isinstance(s, str) or not s:
            raise _err(where, key, "a list of non-empty strings", v)
        if s != s.strip() or _CSV_BAD(s):
            raise _err(where, key, "a list of names a CSV field can hold (no comma, quote, newline, or "
                       "space at either end: %r cannot be written to and read back from a data file)" % s, v)
    for i in range(len(v)):
        if v[i] in v[:i]:
            raise _err(where, key, "a list of unique names (%r repeats)" % v[i], v)
    if n is not None and len(v) != n:
        raise _err(where, key, "a list of %d names (one per %s)" % (n, "channel" if key == "features"
                                                                    else "output"), v)
    return list(v)


def _CSV_BAD(s):
    for c in ",\"\n\r":
        if c in s:
            return True
    return False


def _numbers(where, key, v, n, positive=False):
    if not isinstance(v, (list, tuple)) or len(v) != n:
        raise _err(where, key, "a list of %d numbers (one per feature/channel)" % n, v)
    for x in v:
        if not _is_num(x):
            raise _err(where, key, "a list of finite numbers", v)
        f = array("f", (x,))[0]         # the value a board computes with (a float32 array)
        if f - f != 0 or (x != 0 and f == 0):
            raise _err(where, key, "a list of numbers within float32's range (%r is %s in float32; a "
                       "board would compute with that)" % (x, f), v)
        if positive and not x > 0:
            raise _err(where, key, "a list of numbers > 0 (a std of %r would %s)"
                       % (x, "divide by zero" if x == 0 else "flip the feature's sign"), v)
    return [float(x) for x in v]


def _int(where, key, v, lo):
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise _err(where, key, "an int >= %d" % lo, v)
    return v


def check(meta, where="metadata", rows=None):
    """(meta with defaults filled in, notes). rows: the base data's row count when known (the
    n_train default and bound need it). Raises MetaError on anything a session cannot use."""
    if not isinstance(meta, dict):
        raise MetaError("%s: metadata must be a JSON object (dict), got %s" % (where, type(meta).__name__))
    out = dict(meta)
    notes = []
    task = out.get("task", "classify")
    if task not in TASKS:
        raise _err(where, "task", "one of %s" % ", ".join(repr(t) for t in TASKS), task)
    if "task" not in out:
        notes.append("task: 'classify' (a class per output; 'regress' for MSE on numbers)")
    out["task"] = task
    if task == "classify":
        if "classes" not in out:
            raise MetaError("%s: metadata lacks 'classes' (the label of each output, e.g. "
                            "[\"standing\", \"walking\"]): a classifier needs them" % where)
        out["classes"] = _names(where, "classes", out["classes"])
    # the shape of one example
    shape = out.get("input_shape")
    if shape is None:
        m = out.get("mean")
        if isinstance(m, (list, tuple)) and m:
            shape = [len(m)]
            notes.append("input_shape: [%d] (flat features, from len(mean)); a window model needs "
                         "[L, C]" % len(m))
        else:
            raise MetaError("%s: metadata lacks 'input_shape' ([F] features, or [L, C] for a window "
                            "of L readings of C channels) and 'mean' to infer it from" % where)
    if not isinstance(shape, (list, tuple)) or len(shape) not in (1, 2):
        raise _err(where, "input_shape", "[F] or [L, C]", shape)
    for d in shape:
        _int(where, "input_shape", d, 1)
    out["input_shape"] = list(shape)
    C = shape[-1]
    if "features" in out:
        out["features"] = _names(where, "features", out["features"], C)
    else:
        out["features"] = ["x%d" % j for j in range(C)]
        notes.append("features: x0..x%d (names for messages)" % (C - 1))
    for key, default, pos in (("mean", 0.0, False), ("std", 1.0, True)):
        if key in out:
            out[key] = _numbers(where, key, out[key], C, pos)
        else:
            out[key] = [default] * C
            notes.append("%s: %s per %s (inputs used as they are; give the training data's %s)"
                         % (key, default, "channel" if len(shape) == 2 else "feature", key))
    if task == "regress":
        if "targets" in out:
            out["targets"] = _names(where, "targets", out["targets"])
        else:
            raise MetaError("%s: metadata lacks 'targets' (the name of each output): a regression "
                            "model needs them" % where)
    if "data" in out and out["data"] is not None and (not isinstance(out["data"], str) or not out["data"]):
        raise _err(where, "data", "a file name under data/ (str)", out["data"])
    if "split_seed" in out:
        _int(where, "split_seed", out["split_seed"], 0)
    else:
        out["split_seed"] = 0
        if "split" not in out:
            notes.append("split_seed: 0 (shuffles the base data before the train/test split)")
    if "split" in out:
        _split(where, out["split"], rows, out.get("n_train"))
    if "n_train" in out:
        _int(where, "n_train", out["n_train"], 0)
        if rows is not None and out["n_train"] > rows:
            raise _err(where, "n_train", "at most the %d rows of the base data" % rows, out["n_train"])
    elif "split" not in out:
        notes.append("n_train: %d%% of the base data's rows are 'train', the rest 'test' "
                     "(evaluate() needs a test split)" % int(100 * TRAIN_FRACTION))
    return out, notes


def _split(where, v, rows, n):
    # {"test": [rows]} or {"train": [rows]}: unique ints, in range when the row count is known
    want = "{\"test\": [row, ...]} or {\"train\": [row, ...]} (0-based data rows)"
    if not isinstance(v, dict) or len(v) != 1 or list(v)[0] not in ("train", "test"):
        raise _err(where, "split", want, v)
    part = list(v)[0]
    idx = v[part]
    if not isinstance(idx, (list, tuple)):
        raise _err(where, "split", want, v)
    seen = {}
    for i in idx:
        if not isinstance(i, int) or isinstance(i, bool) or i < 0:
            raise _err(where, "split", "a list of row numbers >= 0 under %r" % part, i)
        if rows is not None and i >= rows:
            raise _err(where, "split", "row numbers below the base data's %d rows" % rows, i)
        if i in seen:
            raise _err(where, "split", "a list of unique row numbers (%d repeats)" % i, i)
        seen[i] = 1
    if rows is not None and n is not None:
        k = len(idx) if part == "train" else rows - len(idx)
        if n != k:
            raise _err(where, "n_train", "%d, as the split gives (%d of %d rows under %r), or absent"
                       % (k, len(idx), rows, part), n)


def split_rows(meta, rows):
    """(train rows, test rows) of `rows` base rows by meta['split'] (in file order), or None
    when the metadata has no split."""
    v = meta.get("split")
    if v is None:
        return None
    part = list(v)[0]
    mark = bytearray(rows)
    for i in v[part]:
        mark[i] = 1
    given = [i for i in range(rows) if mark[i]]
    rest = [i for i in range(rows) if not mark[i]]
    return (given, rest) if part == "train" else (rest, given)


def n_train(meta, rows):
    """The train split's row count for `rows` base rows (meta['n_train'], or the default)."""
    n = meta.get("n_train")
    if n is None and meta.get("split") is not None:
        part = list(meta["split"])[0]
        k = len(meta["split"][part])
        return k if part == "train" else rows - k
    return int(rows * TRAIN_FRACTION) if n is None else n


def num_outputs(meta):
    return len(meta["classes"] if meta.get("task", "classify") == "classify" else meta["targets"])
