# A session's backend does not leak: Session() takes the interpreter's default whatever an earlier
# set_backend chose (as in a REPL kept with `mpremote resume`) and says so; each session keeps its
# own backend for fit and evaluate; a session that fails to start leaves the backend as it was.
#   MICROPYPATH=lib:board:board/demos:board/benchmarks:tests/mp micropython tests/mp/backend_session_mp.py FLASH
# Prints BACKEND SESSION OK or raises AssertionError (tests/mp/test_backend_session.py).
import sys

import microformer as mf

import finetune
import split_mp


def run(root):
    r = {}
    split_mp.write_flash(root)
    default = mf.get_backend()
    mf.set_backend("python")
    s = finetune.Session(root=root, verbose=False)
    r["default"] = (default, s._backend[0], mf.get_backend(), s._backend_note)
    t = finetune.Session(root=root, verbose=False, backend="python")
    r["chosen"] = mf.get_backend()
    s.evaluate(verbose=False)
    r["own_after_evaluate"] = mf.get_backend()
    t.fit(epochs=1, data="train", verbose=False)
    r["own_after_fit"] = mf.get_backend()
    try:
        finetune.Session("missing.mfck", root=root, verbose=False)
    except OSError:
        pass
    r["after_failed_start"] = mf.get_backend()
    return r


def check(r):
    default, got, now, note = r["default"]
    assert default != "python" and got == now == default, r
    assert note == "; 'python', set before this session, is not kept: Session(backend='python') keeps it", note
    assert r["chosen"] == "python" and r["own_after_evaluate"] == default, r
    assert r["own_after_fit"] == "python" and r["after_failed_start"] == "python", r


if __name__ == "__main__":
    check(run(sys.argv[1]))
    print("BACKEND SESSION OK")
