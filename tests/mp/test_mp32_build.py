"""The 32-bit interpreter leg: `make test` without a MicroPython source (one-line notice; a failure
under CI), host/tools/build_mp32.sh refusing a source its patches do not fit, and the patched Ctrl-C of
the 32-bit port (a second SIGINT while one is pending does not kill the process, as on an ESP32)."""
import os
import signal
import subprocess
import time

import pytest

import helpers

BUILD = os.path.join(helpers.TOOLS, "build_mp32.sh")


def _make_test(ci):
    # PY=true: the recipe's own logic runs, lint and pytest do not; MP32 points at a binary that is absent
    return helpers.make("test", "MICROPYTHON_SRC=", "MP32=/nonexistent/mp32", "PY=true",
                        env={"CI": "true" if ci else ""})


def test_make_test_without_source_says_so_in_one_line():
    r = _make_test(ci=False)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [l for l in r.stdout.splitlines() if "32-bit" in l]
    assert len(lines) == 1 and "NOT run" in lines[0] and "MICROPYTHON_SRC" in lines[0], r.stdout


def test_make_test_without_source_fails_under_ci():
    r = _make_test(ci=True)
    assert r.returncode != 0, r.stdout + r.stderr
    assert "CI needs the 32-bit MicroPython leg" in r.stdout, r.stdout


def test_build_refuses_a_source_the_patches_do_not_fit(tmp_path):
    src = tmp_path / "src"
    (src / "py").mkdir(parents=True)
    (src / "ports" / "unix" / "variants").mkdir(parents=True)
    (src / "py" / "mpconfig.h").write_text("#define MICROPY_VERSION_MAJOR 1\n")
    (src / "ports" / "unix" / "Makefile").write_text("all:\n")
    (src / "ports" / "unix" / "variants" / "mpconfigvariant_common.h").write_text(
        "#define MICROPY_ASYNC_KBD_INTR         (1)\n")
    (src / "ports" / "unix" / "unix_mphal.c").write_text("\n")
    r = subprocess.run([BUILD, str(src), str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "mpconfigvariant_common.h: expected the snippet exactly once, found it 0 times" in r.stderr, r.stderr
    assert not (tmp_path / "out" / "micropython32-sp").exists()
    # the source itself is untouched (the patches go to a copy)
    assert (src / "ports" / "unix" / "variants" / "mpconfigvariant_common.h").read_text() == \
        "#define MICROPY_ASYNC_KBD_INTR         (1)\n"


def sigint_bursts(exe, tmp_path, rounds=20):
    """Run tests/mp/sigint_loop_mp.py under `exe`, send `rounds` bursts of two SIGINTs (the second while the first is
    pending), each answered by at least one caught KeyboardInterrupt; return (rc, output)."""
    script, stop = helpers.script("sigint_loop_mp.py"), tmp_path / "stop"
    p = subprocess.Popen([exe, str(script), str(stop)], stdout=subprocess.PIPE, text=True)
    lines = []
    try:
        lines.append(p.stdout.readline().strip())
        assert lines[0] == "ready", lines
        for _ in range(rounds):
            time.sleep(0.02)
            p.send_signal(signal.SIGINT)
            p.send_signal(signal.SIGINT)
            line = p.stdout.readline().strip()
            lines.append(line)
            if not line:
                break                       # the process is gone
        stop.write_text("")
        out, _ = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return p.returncode, lines + out.splitlines()


@pytest.mark.mp32
def test_mp32_survives_a_second_sigint_while_one_is_pending(tmp_path):
    """The 32-bit port is built with Ctrl-C scheduled as on an ESP32: every burst of two SIGINTs
    ends in a KeyboardInterrupt the program catches, and the process is never killed (the unpatched
    unix port exits with status 1 when a second SIGINT arrives while one is pending)."""
    rounds = 20
    rc, lines = sigint_bursts(helpers.need_interpreter("mp32"), tmp_path, rounds)
    assert rc == 0, "the 32-bit port died on a SIGINT burst (rc=%d): %r" % (rc, lines[-3:])
    caught = [l for l in lines if l.startswith("caught")]
    assert len(caught) >= rounds and lines[-1] == "done %d" % len(caught), lines
