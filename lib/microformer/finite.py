# microformer.finite: NaN / inf kept out of the weights, and hyperparameters checked, at the boundaries.
# Values are judged after rounding to float32 (what array('f') stores): 1e39 is inf there.
from array import array

from . import backend

_INF = float("inf")


class NonFiniteError(ValueError):
    """A NaN or +-inf where a finite number is needed (a reading, a loss, a gradient, an update).

    Raised before anything is written: the weights and optimizer state stay as they were.
    """


def show(v):
    """A value for a message: 'nan', 'inf', '-inf' or its repr."""
    if v != v:
        return "nan"
    if v == _INF:
        return "inf"
    if v == -_INF:
        return "-inf"
    return repr(v)


def first_nonfinite(buf, n=None):
    """Index of the first NaN / +-inf in a float32 buffer, or -1 (a kernel: viper on the board)."""
    return backend.K.first_nonfinite(buf, len(buf) if n is None else n)


def check_rows(who, buf, F, names=None, what="example"):
    """Refuse a flat [N, F] float32 buffer holding a NaN or +-inf: NonFiniteError naming the
    row (`what` N) and the feature (0-based index, and its name when `names` is given)."""
    i = backend.K.first_nonfinite(buf, len(buf))
    if i >= 0:
        j = i % F
        name = " (%s)" % names[j] if names and j < len(names) else ""
        raise NonFiniteError("%s: %s %d, feature %d%s is %s; NaN and inf are refused"
                             % (who, what, i // F, j, name, show(buf[i])))


def float32_row(who, values, names=None, index=None, base=1):
    """A list of Python numbers -> array('f'); NonFiniteError if one is NaN / +-inf as float32
    (e.g. 1e39). Features are counted from `base` in the message; `index`: the example's index."""
    row = array("f", values)
    i = backend.K.first_nonfinite(row, len(row))
    if i >= 0:
        name = " (%s)" % names[i] if names and i < len(names) else ""
        v = values[i]
        if v == v and -_INF < v < _INF:         # finite as given, out of float32's range
            got = "%r (%s in float32)" % (float(v), show(row[i]))
        else:
            got = show(v)
        raise NonFiniteError("%s: %sfeature %d%s is %s; NaN and inf readings are refused"
                             % (who, "" if index is None else "example %d, " % index, i + base, name, got))
    return row


def hyper(who, what, v, lo=None, hi=None, lo_open=False, hi_open=False):
    """A hyperparameter as a float: a finite real number within [lo, hi] (open ends when asked);
    otherwise ValueError naming it, the range and the value."""
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and -_INF < v < _INF
    if ok and lo is not None:
        ok = v > lo if lo_open else v >= lo
    if ok and hi is not None:
        ok = v < hi if hi_open else v <= hi
    if not ok:
        if lo is not None and hi is not None:
            rng = "in %s%r, %r%s" % ("(" if lo_open else "[", lo, hi, ")" if hi_open else "]")
        elif lo is not None:
            rng = "%s %r" % (">" if lo_open else ">=", lo)
        elif hi is not None:
            rng = "%s %r" % ("<" if hi_open else "<=", hi)
        else:
            rng = "(any finite value)"
        raise ValueError("%s: %s must be a finite number %s, got %s"
                         % (who, what, rng, show(v) if isinstance(v, float) else repr(v)))
    return float(v)
