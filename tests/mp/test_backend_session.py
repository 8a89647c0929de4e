"""A session's backend does not leak between sessions (tests/mp/backend_session_mp.py), under
CPython and both MicroPython ports."""
import helpers
import backend_session_mp


def test_backend_session_cpython(tmp_path):
    import microformer as mf
    try:
        backend_session_mp.check(backend_session_mp.run(str(tmp_path)))
    finally:
        mf.set_backend("numpy")


def test_backend_session_micropython(tmp_path, micropython):
    out = helpers.run_micropython(helpers.script("backend_session_mp.py"), str(tmp_path), heap="1M",
                                  exe=micropython)
    assert "BACKEND SESSION OK" in out, out
