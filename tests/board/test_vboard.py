"""The virtual board (host/tools/vboard.py) driven by unmodified mpremote, as a real board would be.

Every mpremote call has a timeout: mpremote can block forever on a confused port.
Each board lives in a pytest tmp dir and is stopped in teardown.
"""

import hashlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import serial

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "host" / "tools"))
import vboard  # noqa: E402
import helpers  # noqa: E402

# The interpreter the virtual board runs: the ESP32-like 32-bit port when it is built.
MICROPYTHON = helpers.interpreter_path(helpers.interpreters()[-1])

MPREMOTE = str(Path(sys.executable).parent / "mpremote")
TIMEOUT = 30


def mpremote(board, *args, timeout=TIMEOUT, check=True, text=True):
    """Run `mpremote connect PORT ARGS...`; returns the CompletedProcess."""
    res = subprocess.run([MPREMOTE, "connect", board.port, *args],
                         capture_output=True, text=text, timeout=timeout)
    if check and res.returncode != 0:
        raise AssertionError(f"mpremote {args} rc={res.returncode}\n{res.stdout}\n{res.stderr}")
    return res


def run(board, code, **kw):
    return mpremote(board, "exec", code, **kw).stdout


def child_pids(board):
    return [int(m) for m in re.findall(r"child pid (\d+) started", board.log_path.read_text())]


@pytest.fixture(scope="module")
def board(tmp_path_factory):
    with vboard.VirtualBoard(tmp_path_factory.mktemp("vboard"), heap=helpers.board_heap(MICROPYTHON), micropython=MICROPYTHON) as b:
        yield b


# ------------------------------------------------------------ basic mpremote use

def test_exec_output_has_board_line_endings(board):
    # A board sends \r\n for print(); the unix port alone would send \n (or \r\r\n).
    out = mpremote(board, "exec", "print('a'); print('b')", text=False).stdout
    assert out == b"a\r\nb\r\n"


def test_cp_to_lib_then_import(board, tmp_path):
    src = tmp_path / "vbx_mod.py"
    src.write_text("def f():\n    return 42\n")
    mpremote(board, "cp", str(src), ":/lib/vbx_mod.py")
    assert (board.flash / "lib" / "vbx_mod.py").read_text() == src.read_text()
    assert run(board, "import vbx_mod; print(vbx_mod.f())").strip() == "42"


def test_fs_ls_shows_sizes(board):
    (board.flash / "sized.txt").write_bytes(b"x" * 1234)
    out = mpremote(board, "fs", "ls", ":").stdout
    assert re.search(r"^\s*1234 sized\.txt$", out, re.M), out
    assert re.search(r"^\s*0 lib/$", out, re.M), out


def test_cp_roundtrip_binary(board, tmp_path):
    data = os.urandom(20000)
    (tmp_path / "in.bin").write_bytes(data)
    mpremote(board, "cp", str(tmp_path / "in.bin"), ":rt.bin")
    mpremote(board, "cp", ":rt.bin", str(tmp_path / "out.bin"))
    assert (tmp_path / "out.bin").read_bytes() == data


def test_resume_keeps_state(board):
    run(board, "kept = 1234")
    assert mpremote(board, "resume", "exec", "print(kept)").stdout.strip() == "1234"


def test_repeated_soft_resets(board):
    # Each mpremote invocation soft-resets the board first: state must be fresh every time.
    for i in range(10):
        out = run(board, f"print('fresh' if 'st' not in globals() else 'stale'); st = {i}")
        assert out.strip() == "fresh"


@pytest.mark.parametrize("code", ["import sys; sys.exit()", "import machine; machine.soft_reset()"])
def test_code_that_soft_resets(board, code):
    mpremote(board, "exec", code, check=False)
    assert run(board, "print(6 * 7)").strip() == "42"


def test_exception_traceback(board):
    res = mpremote(board, "exec", "1/0", check=False)
    assert res.returncode == 1
    assert "ZeroDivisionError" in res.stdout + res.stderr
    assert run(board, "print('ok')").strip() == "ok"


# ------------------------------------------------------------ robustness

def test_infinite_loop_is_interrupted_by_next_client(board):
    with pytest.raises(subprocess.TimeoutExpired):
        mpremote(board, "exec", "while True: pass", timeout=3)
    t0 = time.monotonic()
    assert run(board, "print('alive')").strip() == "alive"
    assert time.monotonic() - t0 < 10
    assert "SIGINT" in board.log_path.read_text()


def test_client_killed_mid_transfer(board, tmp_path):
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(200_000))  # mpremote needs ~10 s for this
    proc = subprocess.Popen([MPREMOTE, "connect", board.port, "cp", str(big), ":big.bin"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.5)
    assert proc.poll() is None, "transfer finished before it could be killed"
    proc.kill()
    proc.wait()
    assert run(board, "print('after kill')").strip() == "after kill"
    small = tmp_path / "small.bin"
    small.write_bytes(os.urandom(3000))
    mpremote(board, "cp", str(small), ":small.bin")
    out = run(board, "import hashlib, binascii\n"
                     "print(binascii.hexlify(hashlib.sha256(open('small.bin','rb').read()).digest()).decode())")
    assert out.strip() == hashlib.sha256(small.read_bytes()).hexdigest()


def test_friendly_repl_soft_reboot_over_raw_serial(board):
    # What a terminal (mpremote repl, miniterm) sees: Ctrl-D at >>> soft-reboots.
    with serial.Serial(board.port, 115200, timeout=0.2) as s:
        s.write(b"\r\x03\x02")  # interrupt anything, friendly REPL
        assert read_until(s, b"information.\r\n>>> ").endswith(b">>> ")
        s.write(b"print(1+1)\r")
        assert b"\r\n2\r\n>>> " in read_until(s, b"2\r\n>>> ")
        s.write(b"\x04")
        out = read_until(s, b">>> ")
        assert b"MPY: soft reboot\r\n" in out and out.endswith(b">>> "), out
        assert b"\r\r\n" not in out


def read_until(s, ending, timeout=10):
    data = b""
    deadline = time.monotonic() + timeout
    while not data.endswith(ending) and time.monotonic() < deadline:
        data += s.read(1)
    return data


# ------------------------------------------------------------ boards of their own

def test_memory_error_small_heap(tmp_path):
    with vboard.VirtualBoard(tmp_path, heap="64K", micropython=MICROPYTHON) as b:
        res = mpremote(b, "exec", "x = bytearray(200000)", check=False)
        assert res.returncode == 1
        assert "MemoryError" in res.stdout + res.stderr
        out = run(b, "import gc; print(gc.mem_free() + gc.mem_alloc() < 70000)")
        assert out.strip() == "True"


def test_boot_and_main_run_at_start_and_soft_reset(tmp_path):
    flash = tmp_path / "flash"
    flash.mkdir()
    (flash / "boot.py").write_text("open('trace.txt', 'a').write('B')\nBOOTED = True\n")
    (flash / "main.py").write_text("open('trace.txt', 'a').write('M')\nwhile True:\n    pass\n")
    with vboard.VirtualBoard(tmp_path / "state", flash=flash, micropython=MICROPYTHON) as b:
        assert (flash / "lib").is_dir()
        # main.py loops forever: mpremote's Ctrl-C must break in, as on a board.
        assert run(b, "print(BOOTED)").strip() == "True"
        # mpremote soft-resets from the raw REPL: boot.py runs, main.py is skipped.
        assert (flash / "trace.txt").read_text() == "BMB"
        # A soft reset from the friendly REPL runs main.py again.
        (flash / "main.py").write_text("open('trace.txt', 'a').write('M')\n")
        with serial.Serial(b.port, 115200, timeout=0.2) as s:
            s.write(b"\r\x02")  # leave the raw REPL mpremote left us in
            read_until(s, b"information.\r\n>>> ")
            s.write(b"\x04")
            assert b"MPY: soft reboot" in read_until(s, b">>> ")
        assert (flash / "trace.txt").read_text() == "BMBBM"


def test_cli_and_no_leaked_processes(tmp_path):
    cli = [sys.executable, str(Path(vboard.__file__)), "--dir", str(tmp_path)]

    def call(cmd, *extra):
        return subprocess.run(cli[:2] + [cmd] + cli[2:] + list(extra),
                              capture_output=True, text=True, timeout=TIMEOUT)

    up = call("up", "--heap", "256K", "--micropython", MICROPYTHON)
    assert up.returncode == 0, up.stderr
    port = up.stdout.strip()
    assert port == str(tmp_path / "port") and os.path.realpath(port).startswith("/dev/pts/")
    assert call("path").stdout.strip() == port
    status = call("status")
    assert status.returncode == 0 and "256K" in status.stdout
    b = vboard.VirtualBoard(tmp_path, micropython=MICROPYTHON)
    assert MICROPYTHON in status.stdout
    assert run(b, "print('cli')").strip() == "cli"
    assert call("up", "--micropython", MICROPYTHON).stdout.strip() == port  # idempotent
    daemon = b.pid()
    pids = [daemon] + child_pids(b)
    assert call("down").returncode == 0
    assert call("status").returncode == 1
    assert not any(vboard.pid_alive(p) for p in pids)
    assert not os.path.lexists(port)


def test_stop_leaves_no_processes(tmp_path):
    b = vboard.VirtualBoard(tmp_path, micropython=MICROPYTHON).start()
    run(b, "print(1)")
    pids = [b.pid()] + child_pids(b)
    b.stop()
    assert not any(vboard.pid_alive(p) for p in pids)
