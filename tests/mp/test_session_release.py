"""A session's fit gives its step's buffers back when it ends (tests/mp/session_release_mp.py):
after each of two fits no layer holds the buffers of a pass and the scratch arena is empty, so
evaluate, predict and the next fit find that heap free (the gesture model's board session then
runs from a smaller heap: host/bench/bench_budget.py goals)."""
import helpers

SCRIPT = helpers.script("session_release_mp.py")


def test_session_fit_releases_micropython(tmp_path, iris_flash, micropython):
    out = helpers.run_micropython(SCRIPT, iris_flash(tmp_path / "f"), exe=micropython, heap="2M")
    assert "SESSION RELEASE OK" in out, out


def test_session_fit_releases_cpython(tmp_path, iris_flash):
    out = helpers.run_cpython(SCRIPT, iris_flash(tmp_path / "f"))
    assert "SESSION RELEASE OK" in out, out
