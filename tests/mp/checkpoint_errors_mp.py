# Errors that must name the file (saves into a missing folder, a full volume, a failing medium)
# and PositionalEncoding's start argument, in CPython and MicroPython:
#   MICROPYPATH=lib:tests/mp micropython tests/mp/checkpoint_errors_mp.py DIR
# prints one JSON line per case: {"case", "exc", "errno", "msg", "files"}.
import json
import os
import sys

import microformer as mf
from microformer import checkpoint as ck
import checkpoint_states_mp as cs


def attempt(fn):
    try:
        fn()
    except Exception as e:
        return type(e).__name__, (e.args[0] if isinstance(e, OSError) and e.args else None), str(e)
    return None, None, None


def failing_open(errno, after):
    """open() whose 'wb' files fail with OSError(errno) at open (after None) or after n bytes."""
    def opener(p, mode):
        if mode != "wb":
            return open(p, mode)
        if after is None:
            raise OSError(errno)
        f = cs.Cut(open(p, mode), after, False)
        real = f.write

        def write(b):
            try:
                return real(b)
            except OSError:
                raise OSError(errno)
        f.write = write
        return f
    return opener


def main(d):
    out = []

    old = cs.model(3)

    def report(case, fn, path=None):
        exc, err, msg = attempt(fn)
        out.append({"case": case, "exc": exc, "errno": err, "msg": msg, "files": sorted(os.listdir(d)),
                    "old_loads": cs._load(path) == cs.snap(old) if path else None})

    m = cs.model(5)
    report("missing_directory", lambda: ck.save(d + "/nodir/x.mfck", m))
    path = d + "/m.mfck"
    ck.save(path, old, {"v": "old"})
    for case, errno, after in (("littlefs_36_at_open", 36, None), ("enospc_at_open", 28, None),
                               ("enospc_mid_write", 28, 100), ("eio_mid_write", 5, 100)):
        ck._open = failing_open(errno, after)
        try:
            report(case, lambda: ck.save(path, m, {"v": "new"}), path)
        finally:
            ck._open = open
    os.remove(path)
    ck._open = failing_open(36, None)
    try:
        report("littlefs_36_no_checkpoint_before", lambda: ck.save(path, m, {"v": "new"}))
    finally:
        ck._open = open
    for Layer in (mf.PositionalEncoding, mf.LearnedPositionalEmbedding):
        layer = Layer(8, 4)
        x = mf.Tensor.zeros((2, 3, 4))
        for start in (1.0, -1, True, 6, "0"):
            report("%s start=%r" % (Layer.__name__, start), lambda: layer.forward(x, start))
    for r in out:
        print(json.dumps(r))


if __name__ == "__main__":
    main(sys.argv[1])
