# mf_capture.py: labelled examples from a sensor, for board/finetune.py's Session.
# capture(s, read, label) samples read() into one example (a window of L readings for a window
# model, one reading for a flat one), checks it and appends it to the user's data file.
"""Examples from a sensor.

    import finetune, mf_capture
    s = finetune.Session()
    mf_capture.capture(s, read, 'wave', rate_hz=50, count=3)

read: any callable returning one reading: a number (one channel or feature) or a list/tuple of
C numbers (an ADC's read_u16, an I2C IMU driver's acceleration, a list iterator's __next__ in
a test). The session's input_shape says what one example is:
  [L, C] (a window model): n = L readings of C channels, sampled at rate_hz, stored time-major
         as one row of L*C numbers;
  [F]    (a flat model): one reading of F features is one example (n = 1).
count examples are sampled back to back, then appended in one go through s.add_examples: every
reading is checked first (its length and type, NaN / inf refused), so a bad reading, an error
in read() or Ctrl-C during the capture writes nothing.
"""
import time

from microformer.finite import float32_row, hyper

RATE_HZ = 50.0


def _now_us():
    try:
        return time.ticks_us()
    except AttributeError:
        return int(time.perf_counter() * 1000000)


def _diff_us(a, b):
    """a - b in microseconds (ticks wrap on a board)."""
    try:
        return time.ticks_diff(a, b)
    except AttributeError:
        return a - b


def _add_us(t, us):
    try:
        return time.ticks_add(t, us)
    except AttributeError:
        return t + us


def _sleep_us(us):
    if us <= 0:
        return
    try:
        time.sleep_us(us)
    except AttributeError:
        time.sleep(us / 1000000)


def example_shape(session):
    """(n, C, names): readings per example, numbers per reading and their names, from the
    session's input_shape ([L, C] windows or [F] flat features)."""
    shape = getattr(session, "input_shape", None) or session.meta.get("input_shape") or \
        [session.num_features]
    names = list(getattr(session, "features", None) or [])
    if len(shape) == 2:
        return shape[0], shape[1], names
    if len(shape) == 1:
        return 1, shape[0], names
    raise ValueError("capture: the session's input_shape must be [F] or [L, C], got %r" % (shape,))


def _reading(who, v, C, names):
    # one reading -> a list of C floats, or an error naming what was expected and what came
    if C == 1 and isinstance(v, (int, float)) and not isinstance(v, bool):
        v = [v]
    if not isinstance(v, (list, tuple)) or len(v) != C:
        raise ValueError("%s: read() must return %s, got %r" % (
            who, "a number or a list of 1 number" if C == 1 else "a list of %d numbers (%s)"
            % (C, ", ".join(names) if names else "one per channel"), v))
    for j in range(C):
        if not isinstance(v[j], (int, float)) or isinstance(v[j], bool):
            raise ValueError("%s: value %d%s must be a number, got %r"
                             % (who, j + 1, " (%s)" % names[j] if j < len(names) else "", v[j]))
    v = [float(x) for x in v]
    float32_row(who, v, names)              # NonFiniteError: NaN / inf refused, nothing written
    return v


def capture(session, read, label, n=None, rate_hz=RATE_HZ, count=1, verbose=None):
    """Sample `count` examples from read() and append them to the session's user data file
    with `label` (a class name or index); returns the (features, label) pairs appended (a list
    shown in one line).

    n: readings per example (None: the session's window length L, or 1 for a flat model; any
    other value is refused). rate_hz: readings per second (the time read() takes counts in the
    period; a slower read() lowers the rate, and capture says so). Nothing is written unless
    every reading of every example is good; Ctrl-C during the capture writes nothing.
    """
    if not callable(read):
        raise ValueError("capture: read must be a function returning one reading, got %r" % (read,))
    L, C, names = example_shape(session)
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n != L):
        raise ValueError("capture: n must be None or %d (the readings per example this model "
                         "takes: input_shape %r), got %r"
                         % (L, getattr(session, "input_shape", None) or session.meta.get("input_shape")
                            or [C], n))
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ValueError("capture: count must be an int >= 1, got %r" % (count,))
    rate_hz = hyper("capture", "rate_hz", rate_hz, 0.0, None, True)
    if hasattr(session, "task"):                # an unknown label: refused before any sampling
        from mf_commands import check_label
        check_label(session.task, session.classes, session.targets, label, "capture")
    if verbose is None:
        verbose = getattr(session, "verbose", True)
    period = int(1000000 / rate_hz)
    pairs = []
    slow = 0
    due = _now_us()                         # every reading's time, back to back across examples
    try:
        for k in range(count):
            if verbose:
                print("capture: example %d/%d (%s): %d reading%s at %g Hz ..."
                      % (k + 1, count, label, L, "" if L == 1 else "s", rate_hz))
            x = []
            t0 = due
            for i in range(L):
                wait = _diff_us(due, _now_us())
                if wait > 0:
                    _sleep_us(wait)
                elif i and wait < -period // 2:
                    slow += 1
                who = "capture: example %d, reading %d of %d" % (k + 1, i + 1, L)
                x.extend(_reading(who, read(), C, names))
                due = _add_us(due, period)
            if verbose and L > 1:
                took = _diff_us(_now_us(), t0) / 1000000
                print("  %d readings in %.2f s (%.1f Hz)" % (L, took, (L - 1) / took if took > 0 else 0))
            pairs.append((x, label))
    except BaseException as e:              # a bad reading, read() failing, Ctrl-C
        if verbose:
            print("capture: %s during example %d of %d; nothing written"
                  % ("interrupted" if isinstance(e, KeyboardInterrupt) else "stopped by " +
                     type(e).__name__, len(pairs) + 1, count))
        raise
    if slow:
        print("note: read() was slower than %g Hz for %d reading%s (each example still has %d "
              "readings; lower rate_hz or make read() faster)"
              % (rate_hz, slow, "" if slow == 1 else "s", L))
    session.add_examples(pairs)
    from mf_commands import Pairs           # a list the REPL shows in one line
    return Pairs(pairs)
