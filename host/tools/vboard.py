"""Virtual board: the MicroPython unix port behind a pseudo-terminal that
unmodified ``mpremote`` drives exactly as it drives an ESP32 over USB serial.

Usage::

    python host/tools/vboard.py up [--dir STATE_DIR] [--heap 512K] [--flash FLASH_DIR] [--micropython EXE]
    python host/tools/vboard.py down|status|path [--dir STATE_DIR]
    mpremote connect build/vboard/port exec "print('hi')"
    make mpremote ARGS="cp :model.mfck tuned.mfck"     # the same, the board started when needed

The interpreter
---------------
``--micropython``, else env ``MICROPYTHON``, else the ESP32-like port
``build/mp32/micropython32-sp`` when it is built (32-bit, single-precision floats,
Ctrl-C scheduled as on an ESP32 rather than raised from the signal handler), else
the stock 64-bit unix port next to this Python.  ``up`` on a board that runs with
another heap or interpreter restarts it and says so (the REPL state is lost; the
flash folder is kept); ``status`` names the interpreter and the heap.

Design
------
``up`` starts a daemon (``vboard.py serve``) in its own session and returns once
the board shows its first REPL prompt.  The daemon owns two pseudo-terminals:

* the *client pty*: its slave is what mpremote opens, reached through the
  stable symlink ``STATE_DIR/port`` (mpremote special-cases ``/dev/pts/N`` and
  can hang on it).  The daemon keeps its own fd on the slave open so that the
  master never reports EIO/hang-up while no client is connected; pyserial
  flushes stale input when a client opens the port.
* the *child pty*: the stdin/stdout/stderr of ``micropython -X heapsize=HEAP -i
  BOOT``.  On a tty the unix port runs the same REPL code as a board (raw
  REPL, raw-paste, Ctrl-D ...).  BOOT mounts the flash folder as ``/``, sets
  ``sys.path`` like a board and runs ``boot.py`` then ``main.py``; ``-i`` then
  enters the REPL.

A single ``select`` loop copies bytes both ways with back-pressure (it stops
reading one side while the other side's buffer is full) and papers over what
differs from a board:

* Line endings: both ptys are raw (no ``\\r\\r\\n``); bare ``\\n`` from ``print``
  becomes ``\\r\\n`` as on a board.
* Soft reset: Ctrl-D, ``sys.exit()`` and ``machine.soft_reset()`` end the unix
  process.  The daemon then prints ``MPY: soft reboot\\r\\n`` and starts a new
  interpreter on a new child pty while the client pty stays open.  A board
  that soft-resets from the raw REPL comes back in the raw REPL and skips
  ``main.py``: the daemon tracks the REPL mode from the REPL's own banners,
  and for a raw restart it pre-sends Ctrl-A and hides the friendly banner.
* Ctrl-C: while code runs, the unix port reads 0x03 as a plain byte.  A board
  turns it into KeyboardInterrupt, so when the child has its SIGINT handler
  installed (i.e. it is executing code; read from ``/proc/PID/status``) the
  daemon sends SIGINT instead of the byte.  When the REPL is idle the handler
  is not installed (SIGINT would kill it) and the byte is passed through; so
  is it after ``micropython.kbd_intr(-1)`` (mpremote mount relies on that),
  which is what a board does with a Ctrl-C while kbd_intr(-1) is in force.
  The handler can go away between the check and the signal (the code ends and
  the REPL restores SIG_DFL), and a SIGINT then kills the process: so the
  daemon stops the child (SIGSTOP), checks, sends SIGINT while it is stopped,
  and continues it (SIGCONT).  Every Ctrl-C becomes one SIGINT, as on a board
  where each Ctrl-C schedules a KeyboardInterrupt; both ports survive a second
  SIGINT before the first is handled (the stock port raises from the handler,
  the 32-bit build schedules it like an ESP32).  The stock port's asynchronous
  raise can leave the allocator locked ("MemoryError: heap is locked") if it
  lands inside gc_alloc; the scheduled build cannot, which is one reason the
  virtual board prefers it.
* ``VfsPosix.ilistdir`` gives 3-tuples; BOOT mounts a wrapper that adds the
  size so ``mpremote fs ls`` shows it.

The state dir holds ``vboard.pid``, ``vboard.log``, ``config.json``, ``ready``,
``vboard_boot.py`` (BOOT),
the ``port`` symlink and (by default) the ``flash/`` folder with ``lib/``.
"""

import argparse
import ctypes
import errno
import fcntl
import json
import logging
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
import tty
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_STATE_DIR = REPO_ROOT / "build" / "vboard"
DEFAULT_HEAP = "512K"

RAW_BANNER = b"raw REPL; CTRL-B to exit\r\n"
FRIENDLY_BANNER = b'Type "help()" for more information.\r\n'
# The friendly-REPL greeting, hidden when the board comes back in raw mode.
GREETING_RE = re.compile(
    rb'MicroPython [^\r\n]*\r\nType "help\(\)" for more information\.\r\n>>> ')
SOFT_REBOOT = b"MPY: soft reboot\r\n"
# First thing BOOT prints (stripped by the daemon): MicroPython is running and
# has its SIGINT handler, so Ctrl-C may now become SIGINT (before it, SIGINT
# would hit the hosting CPython process).
SENTINEL = "\x00vboard-boot\x00"
SETTLE = 1.0                   # a board whose main.py never ends counts as up after this
CTRL_A, CTRL_C = b"\x01", 0x03
BUF_LIMIT = 64 * 1024          # back-pressure threshold per direction
READY_TIMEOUT = 30.0

log = logging.getLogger("vboard")

# Runs inside MicroPython before the REPL:
# ``micropython -X heapsize=HEAP -i STATE_DIR/vboard_boot.py FLASH_DIR main|nomain``
BOOT_TEMPLATE = r'''
import vfs, os, sys
sys.stdout.write(%(sentinel)r)
FLASH, RUN_MAIN = sys.argv[1], sys.argv[2] == 'main'
sys.argv[:] = []

class _VBFlash:
    # VfsPosix.ilistdir yields 3-tuples; boards add the size (mpremote fs ls).
    # A wrapper, not a subclass: a Python subclass of VfsPosix breaks imports
    # from absolute paths such as /lib (the native import_stat misreads it).
    def __init__(self, root):
        self._fs = vfs.VfsPosix(root)

    def __getattr__(self, name):
        return getattr(self._fs, name)

    def __str__(self):
        return str(self._fs)  # '<VfsPosix>', for mpremote df

    def rename(self, old, new):
        # Some unix-port builds lose the first path when both are absolute (one shared buffer
        # for the root prefix): pass the second relative to the cwd, which VfsPosix keeps as
        # the process's own. A board's littlefs or FAT takes both forms.
        if new.startswith('/'):
            import os
            depth = len([p for p in os.getcwd().split('/') if p])
            new = '../' * depth + new.lstrip('/')
        return self._fs.rename(old, new)

    def ilistdir(self, path):
        base = path.rstrip('/')
        for e in self._fs.ilistdir(path):
            size = 0
            if e[1] != 0x4000:
                try:
                    size = self._fs.stat(base + '/' + e[0])[6]
                except OSError:
                    pass
            yield (e[0], e[1], e[2], size)

def _vb_run(name):
    try:
        src = open(name).read()
    except OSError:
        return
    try:
        exec(compile(src, name, 'exec'), globals())
    except SystemExit:
        # A board soft-resets; here a SystemExit would only reach the -i REPL,
        # so end this process and let the daemon reboot it.
        os.system('kill -TERM $PPID')
        while True:
            pass
    except BaseException as e:
        sys.print_exception(e)

vfs.umount('/')
vfs.mount(_VBFlash(FLASH), '/')
os.chdir('/')
sys.path[:] = ['', '.frozen', '/lib']
_vb_run('boot.py')
if RUN_MAIN:
    _vb_run('main.py')
del _VBFlash, _vb_run, FLASH, RUN_MAIN, vfs, os, sys
'''


MP32 = REPO_ROOT / "build" / "mp32" / "micropython32-sp"


# --------------------------------------------------------------- helpers

def find_micropython():
    """env MICROPYTHON, else the ESP32-like build/mp32 port, else the stock port next to this
    Python, else PATH."""
    if os.environ.get("MICROPYTHON"):
        return os.environ["MICROPYTHON"]
    if MP32.exists():
        return str(MP32)
    beside = Path(sys.executable).parent / "micropython"
    if beside.exists():
        return str(beside)
    found = shutil.which("micropython")
    if not found:
        raise SystemExit("vboard: no micropython found (set MICROPYTHON, or `make setup`)")
    return found


def describe_interpreter(exe):
    """'32-bit, single-precision floats' or '64-bit, double-precision floats' (asks the binary)."""
    try:
        out = subprocess.run([exe, "-c", "import sys\nprint(64 if sys.maxsize > 2**32 else 32, "
                              "'single' if 1.0 + 1e-10 == 1.0 else 'double')"],
                             capture_output=True, text=True, timeout=10).stdout.split()
        return "%s-bit, %s-precision floats" % (out[0], out[1])
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


def to_crlf(data, prev_cr):
    """Turn bare \\n into \\r\\n; prev_cr says whether the last byte sent was \\r."""
    if prev_cr and data.startswith(b"\n"):
        return b"\n" + re.sub(rb"(?<!\r)\n", b"\r\n", data[1:])
    return re.sub(rb"(?<!\r)\n", b"\r\n", data)


def catches_sigint(pid):
    """True while MicroPython has its SIGINT handler installed (code is running)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) & (1 << (signal.SIGINT - 1)))
    except OSError:
        pass
    return False


def _die_with_parent():
    """preexec_fn: the child gets SIGKILL if the daemon dies (PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)
    except Exception:
        pass


def proc_state(pid):
    """The state letter of /proc/PID/stat ('R', 'S', 'T' ...), '' if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0]
    except (OSError, IndexError):
        return ""


def stop_and_wait(pid, timeout=1.0):
    """SIGSTOP pid and wait until it is stopped; False if it is gone."""
    try:
        os.kill(pid, signal.SIGSTOP)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = proc_state(pid)
        if st in ("T", "t"):
            return True
        if st in ("", "Z", "X"):
            return False
        time.sleep(0.0005)
    return True   # not seen stopped (e.g. in uninterruptible I/O): checked anyway


def set_nonblocking(fd):
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def is_vboard(pid):
    """Guard against a stale pid file whose pid now belongs to something else."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"vboard" in f.read()
    except OSError:
        return False


class Shutdown(Exception):
    pass


# --------------------------------------------------------------- the child

class Child:
    """One MicroPython process on its own raw pty."""

    def __init__(self, micropython, heap, boot, flash, raw):
        self.master, slave = os.openpty()
        tty.setraw(slave)  # no output processing, no ISIG, no echo
        self.proc = subprocess.Popen(
            [micropython, "-X", f"heapsize={heap}", "-i", str(boot), str(flash),
             "nomain" if raw else "main"],
            stdin=slave, stdout=slave, stderr=slave, cwd=str(flash),
            start_new_session=True, preexec_fn=_die_with_parent)
        os.close(slave)
        set_nonblocking(self.master)
        self.started = time.monotonic()
        self.booted_at = None      # when SENTINEL arrived
        self.pending = b""         # output before SENTINEL
        self.sigints = 0
        log.info("child pid %d started (%s REPL)", self.proc.pid, "raw" if raw else "friendly")

    def read(self):
        """Bytes from the child, b'' once it has gone (EIO on a pty), None if none yet."""
        try:
            return os.read(self.master, 65536)
        except BlockingIOError:
            return None
        except OSError as e:
            if e.errno == errno.EIO:
                return b""
            raise

    def strip_sentinel(self, data):
        """Remove SENTINEL from the start of the output; returns what to pass on."""
        if self.booted_at is not None:
            return data
        self.pending += data
        at = self.pending.find(SENTINEL.encode())
        if at < 0 and len(self.pending) < 4096:
            return b""
        self.booted_at = time.monotonic()
        data, self.pending = self.pending, b""
        return data if at < 0 else data[:at] + data[at + len(SENTINEL):]

    def interrupt(self):
        """Deliver Ctrl-C as a board would. Returns True if the byte is consumed.

        The child is stopped while its SIGINT disposition is checked and the signal is sent,
        so the handler cannot be removed in between (a SIGINT to SIG_DFL would kill it).
        """
        pid = self.proc.pid
        if self.booted_at is None or not catches_sigint(pid):
            log.info("Ctrl-C -> byte to child %d (no handler: idle REPL or kbd_intr(-1))", pid)
            return False        # idle REPL or kbd_intr(-1): the byte, as a board reads it
        if not stop_and_wait(pid):
            return False
        try:
            caught = catches_sigint(pid)
            if caught:
                self.sigints += 1
                os.kill(pid, signal.SIGINT)
        finally:
            os.kill(pid, signal.SIGCONT)
        log.info("Ctrl-C -> %s child %d", "SIGINT to" if caught else "byte to", pid)
        return caught

    def close(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        rc = self.proc.wait()
        os.close(self.master)
        log.info("child pid %d ended rc=%s", self.proc.pid, rc)


# --------------------------------------------------------------- the bridge

class Bridge:
    """The daemon: client pty <-> select loop <-> MicroPython child."""

    def __init__(self, state_dir, heap, flash, micropython=None):
        self.state_dir, self.heap, self.flash = Path(state_dir), heap, Path(flash)
        self.micropython = micropython or find_micropython()
        self.boot = self.state_dir / "vboard_boot.py"
        self.boot.write_text(BOOT_TEMPLATE % {"sentinel": SENTINEL})
        self.to_client = bytearray()
        self.to_child = bytearray()
        self.prev_cr = False
        self.tail = b""            # last bytes of child output, for banner detection
        self.raw_mode = False      # REPL mode last shown by the child
        self.hold = None           # output held back during a raw-mode restart
        self.ready = False
        self.child = None

    # -- setup / teardown
    def open_port(self):
        self.master, self.slave_keep = os.openpty()
        tty.setraw(self.slave_keep)
        set_nonblocking(self.master)
        pts = os.ttyname(self.slave_keep)
        link = self.state_dir / "port"
        tmp = self.state_dir / "port.tmp"
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        os.symlink(pts, tmp)
        os.replace(tmp, link)  # atomic: a stale link is never half-updated
        log.info("port %s -> %s", link, pts)

    def close(self):
        if self.child:
            self.child.close()
            self.child = None
        for name in ("port", "ready", "vboard.pid"):
            p = self.state_dir / name
            if p.is_symlink() or p.exists():
                p.unlink()
        log.info("stopped")

    # -- child lifecycle
    def start_child(self, raw):
        self.child = Child(self.micropython, self.heap, self.boot, self.flash, raw)
        if raw:
            # Come back in the raw REPL like a board: Ctrl-A before anything the
            # client sends, and hide the friendly greeting until the raw banner.
            self.to_child[:0] = CTRL_A
            self.hold = bytearray()

    def soft_reboot(self):
        """The unix process ended (Ctrl-D, sys.exit(), soft_reset()): reboot it."""
        quick = time.monotonic() - self.child.started < 1.0
        self.child.close()
        self.flush_hold()
        self.emit(SOFT_REBOOT)
        log.info("soft reboot (%s REPL)", "raw" if self.raw_mode else "friendly")
        if quick and not self.ready:
            time.sleep(1.0)  # do not spin if the interpreter cannot start at all
        self.start_child(self.raw_mode)

    # -- data paths
    def emit(self, data):
        """Queue bytes for the client, converting line endings like a board."""
        if not data:
            return
        self.to_client += to_crlf(data, self.prev_cr)
        self.prev_cr = data.endswith(b"\r")

    def flush_hold(self):
        if self.hold is not None:
            self.to_client += self.hold
            self.hold = None

    def on_child_output(self, data):
        data = self.child.strip_sentinel(data)
        if not data:
            return
        data = to_crlf(data, self.prev_cr)
        self.prev_cr = data.endswith(b"\r")
        self.track_mode(data)
        if self.hold is None:
            self.to_client += data
            return
        self.hold += data
        if RAW_BANNER in self.hold or len(self.hold) > BUF_LIMIT:
            self.hold[:] = GREETING_RE.sub(b"", bytes(self.hold), count=1)
            self.flush_hold()

    def track_mode(self, data):
        seen = self.tail + data
        raw_at, friendly_at = seen.rfind(RAW_BANNER), seen.rfind(FRIENDLY_BANNER)
        if raw_at >= 0 or friendly_at >= 0:
            self.raw_mode = raw_at > friendly_at
            if not self.ready:
                self.mark_ready()
        self.tail = seen[-64:]

    def mark_ready(self):
        self.ready = True
        (self.state_dir / "ready").write_text(str(os.getpid()))
        log.info("ready")

    def on_client_input(self, data):
        if CTRL_C not in data:
            self.to_child += data
            return
        for byte in data:
            if byte == CTRL_C and self.child and self.child.interrupt():
                continue
            self.to_child.append(byte)

    # -- the loop
    def run(self):
        self.open_port()
        self.start_child(False)
        while True:
            self.step()

    def step(self):
        child = self.child.master
        rd = [self.master] if len(self.to_child) < BUF_LIMIT else []
        if len(self.to_client) < BUF_LIMIT:
            rd.append(child)
        wr = ([self.master] if self.to_client else []) + ([child] if self.to_child else [])
        r, w, _ = select.select(rd, wr, [], self.settle_timeout())
        if not self.ready and self.settle_timeout() == 0:
            self.mark_ready()  # main.py is still running: fine, a board is up then too
        if self.master in w:
            self.to_client = self.write(self.master, self.to_client)
        if child in w:
            self.to_child = self.write(child, self.to_child)
        if self.master in r:
            self.read_client()
        if child in r:
            data = self.child.read()
            if data == b"":
                self.soft_reboot()
            elif data:
                self.on_child_output(data)

    def settle_timeout(self):
        """Seconds until a booted board counts as ready; None once ready."""
        if self.ready or self.child.booted_at is None:
            return None if self.ready else 0.1
        return max(0.0, self.child.booted_at + SETTLE - time.monotonic())

    def read_client(self):
        try:
            data = os.read(self.master, 65536)
        except (BlockingIOError, OSError):
            return  # we hold the slave open, so EIO should not happen
        self.on_client_input(data)

    @staticmethod
    def write(fd, buf):
        try:
            n = os.write(fd, buf)
        except (BlockingIOError, InterruptedError):
            return buf
        except OSError as e:
            if e.errno == errno.EIO:  # child just went away; reboot will follow
                return buf
            raise
        return buf[n:]


def serve(state_dir, heap, flash, micropython=None):
    """Daemon entry point (``vboard.py serve``)."""
    state_dir = Path(state_dir)
    logging.basicConfig(filename=str(state_dir / "vboard.log"), level=logging.INFO,
                        format="%(asctime)s %(message)s")

    def on_term(signum, frame):
        raise Shutdown()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)
    signal.signal(signal.SIGINT, on_term)
    (state_dir / "vboard.pid").write_text(str(os.getpid()))
    bridge = Bridge(state_dir, heap, flash, micropython)
    log.info("serve pid %d heap %s flash %s micropython %s", os.getpid(), heap, flash,
             bridge.micropython)
    try:
        bridge.run()
    except Shutdown:
        pass
    except Exception:
        log.exception("daemon crashed")
        raise
    finally:
        bridge.close()


# --------------------------------------------------------------- control side

class VirtualBoard:
    """Start/stop the daemon; usable as a context manager in tests."""

    def __init__(self, state_dir=DEFAULT_STATE_DIR, heap=DEFAULT_HEAP, flash=None, micropython=None):
        self.state_dir = Path(state_dir).resolve()
        # heap None: the running board's (a deploy or mpremote call keeps the board `make board-up
        # HEAP=8M` started), else DEFAULT_HEAP
        self.heap = heap or (self.pid() and self.config().get("heap")) or DEFAULT_HEAP
        self.flash = Path(flash).resolve() if flash else self.state_dir / "flash"
        self.micropython = str(Path(micropython or find_micropython()).resolve())
        self.proc = None

    port = property(lambda self: str(self.state_dir / "port"))
    log_path = property(lambda self: self.state_dir / "vboard.log")
    pid_path = property(lambda self: self.state_dir / "vboard.pid")

    def pid(self):
        """The daemon's pid if it is running, else None."""
        try:
            pid = int(self.pid_path.read_text())
        except (OSError, ValueError):
            return None
        return pid if pid_alive(pid) and is_vboard(pid) else None

    def is_ready(self):
        return self.pid() is not None and (self.state_dir / "ready").exists()

    def config(self):
        """What the running (or last) board was started with: heap, flash, port, micropython."""
        try:
            return json.loads((self.state_dir / "config.json").read_text())
        except (OSError, ValueError):
            return {}

    def differences(self):
        """How the running board differs from this one's settings, e.g. ['heap 512K, not 4M']."""
        cfg = self.config()
        out = []
        if cfg.get("heap", "").upper() != self.heap.upper():
            out.append(f"heap {cfg.get('heap', '?')}, not {self.heap}")
        if cfg.get("micropython") != self.micropython:
            out.append(f"interpreter {cfg.get('micropython', '?')}, not {self.micropython}")
        return out

    def start(self, timeout=READY_TIMEOUT, restart=False, say=print):
        """Start the board; if it runs already with another heap or interpreter, restart it
        (restart=True) or say so and keep it."""
        if not re.fullmatch(r"\d+[KkMm]?", self.heap):
            raise ValueError(f"bad heap size {self.heap!r} (expected e.g. 512K, 4M)")
        if self.is_ready():
            diff = self.differences()
            if not diff:
                return self
            if not restart:
                say("note: the virtual board keeps running with %s (`make board-up HEAP=%s` restarts "
                    "it with the heap asked for)" % ("; ".join(diff), self.heap))
                return self
            say("restarting the virtual board: it ran with %s (its REPL state is lost, the flash "
                "folder is kept)" % "; ".join(diff))
            self.stop()
        (self.flash / "lib").mkdir(parents=True, exist_ok=True)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        for name in ("ready", "vboard.pid"):
            (self.state_dir / name).unlink(missing_ok=True)
        (self.state_dir / "config.json").write_text(json.dumps(
            {"heap": self.heap, "flash": str(self.flash), "port": self.port,
             "micropython": self.micropython, "kind": describe_interpreter(self.micropython)}))
        with open(self.log_path, "ab") as logf:
            self.proc = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "serve",
                 "--dir", str(self.state_dir), "--heap", self.heap, "--flash", str(self.flash),
                 "--micropython", self.micropython],
                stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                start_new_session=True, cwd=str(REPO_ROOT))
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout):
        deadline = time.monotonic() + timeout
        while not (self.state_dir / "ready").exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"virtual board did not start; see {self.log_path}")
            time.sleep(0.05)

    def stop(self, timeout=10.0):
        pid = self.pid() or (self.proc.pid if self.proc and self.proc.poll() is None else None)
        if pid:
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while pid_alive(pid) and time.monotonic() < deadline:
                if self.proc and self.proc.poll() is not None:
                    break
                time.sleep(0.05)
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
        if self.proc:
            self.proc.wait()
            self.proc = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


# --------------------------------------------------------------- CLI

def main(argv=None):
    ap = argparse.ArgumentParser(prog="vboard.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=["up", "down", "status", "path", "serve"])
    ap.add_argument("--dir", default=str(DEFAULT_STATE_DIR), help="state dir (default build/vboard)")
    ap.add_argument("--heap", default=None,
                    help="MicroPython GC heap, e.g. 512K, 8M (default: the running board's, else %s)"
                         % DEFAULT_HEAP)
    ap.add_argument("--flash", default=None, help="folder mounted as / (default STATE_DIR/flash)")
    ap.add_argument("--micropython", default=None,
                    help="interpreter (default: env MICROPYTHON, else build/mp32/micropython32-sp "
                         "when built, else the stock unix port)")
    args = ap.parse_args(argv)
    running = VirtualBoard(args.dir, micropython=args.micropython)
    heap = args.heap or (running.pid() and running.config().get("heap")) or DEFAULT_HEAP
    board = VirtualBoard(args.dir, heap, args.flash, args.micropython)
    if args.command == "serve":
        serve(board.state_dir, board.heap, board.flash, board.micropython)
    elif args.command == "up":
        board.start(restart=True, say=lambda s: print(s, file=sys.stderr))
        cfg = board.config()
        print("virtual board: %s (%s), heap %s" % (cfg.get("micropython"), cfg.get("kind"),
                                                   cfg.get("heap")), file=sys.stderr)
        print(board.port)
    elif args.command == "down":
        board.stop()
        print("virtual board stopped")
    elif args.command == "path":
        print(board.port)
    elif args.command == "status":
        return print_status(board)
    return 0


def print_status(board):
    pid = board.pid()
    if pid is None:
        print("virtual board: not running")
        return 1
    cfg = board.config()
    print(f"virtual board: running (pid {pid}, {'ready' if board.is_ready() else 'starting'})")
    print(f"  port:  {board.port} -> {os.path.realpath(board.port)}")
    print(f"  micropython: {cfg.get('micropython', '?')} ({cfg.get('kind', '?')})")
    print(f"  heap:  {cfg.get('heap', '?')}")
    print(f"  flash: {cfg.get('flash', '?')}")
    print(f"  log:   {board.log_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
