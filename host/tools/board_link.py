"""Talking to a board with mpremote: a real one on PORT, or the virtual board when PORT is empty."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
LIB = ROOT / "lib" / "microformer"

# lib/microformer files that run on the host only (the board has no NumPy): deploy and mip skip them
HOST_ONLY = ("kernels_numpy.py",)


# the folders whose .py files a board gets in its root folder, imported there by their bare names:
# the session (board/), the demos (board/demos/), the benchmarks and checks (board/benchmarks/)
BOARD_DIRS = (ROOT / "board", ROOT / "board" / "demos", ROOT / "board" / "benchmarks")


def board_files():
    """board/*.py, board/demos/*.py and board/benchmarks/*.py, sorted by name: all land in the board's
    root folder, so a name may be in one folder only (a second one stops here)."""
    files = {}
    for d in BOARD_DIRS:
        for p in d.glob("*.py"):
            if p.name in files:
                raise SystemExit("board files: %s and %s share a name; a board's root folder holds one"
                                 % (files[p.name].relative_to(ROOT), p.relative_to(ROOT)))
            files[p.name] = p
    return [files[n] for n in sorted(files)]


def board_lib_files():
    """The lib/microformer/*.py files a board gets, sorted."""
    return [p for p in sorted(LIB.glob("*.py")) if p.name not in HOST_ONLY]

# sys.implementation._mpy >> 10 & 0xF -> the -march mpy-cross needs for native/viper code
ARCHS = {0: None, 1: "x86", 2: "x64", 3: "armv6", 4: "armv6m", 5: "armv7m", 6: "armv7em",
         7: "armv7emsp", 8: "armv7emdp", 9: "xtensa", 10: "xtensawin", 11: "rv32imc", 12: "rv64imc"}


def tool(name):
    """A command installed next to this Python (the project's .venv), else from PATH."""
    p = BIN / name
    return str(p) if p.exists() else name


def resolve_port(port=None, heap=None, quiet=False):
    """PORT if given; otherwise the virtual board's port, starting the board when needed."""
    port = port or os.environ.get("PORT") or ""
    if port:
        return port
    sys.path.insert(0, str(ROOT / "host" / "tools"))
    import vboard
    # no HEAP asked for: a running board keeps its heap; a new one gets vboard.DEFAULT_HEAP
    board = vboard.VirtualBoard(heap=heap or os.environ.get("HEAP") or None)
    if not board.is_ready() and not quiet:
        print("no PORT given: starting the virtual board (%s, %s, heap %s%s)"
              % (board.port, board.micropython, board.heap,
                 ": a board without PSRAM; `make board-up HEAP=8M` first for one with PSRAM's 8 MB"
                 if board.heap == vboard.DEFAULT_HEAP else ""))
    # a running board with another heap or interpreter is kept, with a note on stderr
    board.start(say=lambda s: print(s, file=sys.stderr))
    return str(board.port)


def mpremote(port, *args, timeout=120, check=True, capture=True):
    """Run `mpremote connect PORT ARGS...`; raise with its output on failure or timeout."""
    cmd = [tool("mpremote"), "connect", port] + [str(a) for a in args]
    try:
        proc = subprocess.run(cmd, capture_output=capture, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SystemExit("mpremote timed out after %d s: %s" % (timeout, " ".join(cmd)))
    if check and proc.returncode != 0:
        out = (proc.stdout or "") + (proc.stderr or "")
        raise SystemExit("mpremote failed (rc=%d): %s\n%s" % (proc.returncode, " ".join(cmd), out[-2000:]))
    return proc.stdout if capture else ""


def board_mpy(port):
    """(mpy version, sub-version, arch name or None) from sys.implementation._mpy on the board."""
    out = mpremote(port, "exec", "import sys; print('MPY', getattr(sys.implementation, '_mpy', 0))")
    for line in out.splitlines():
        if line.startswith("MPY "):
            v = int(line.split()[1])
            return v & 0xFF, (v >> 8) & 3, ARCHS.get((v >> 10) & 0xF)
    raise SystemExit("could not read sys.implementation._mpy from the board:\n" + out)


if __name__ == "__main__":
    # `python host/tools/board_link.py port`: the port to talk to (starts the virtual board if PORT is empty)
    if sys.argv[1:] == ["port"]:
        print(resolve_port(quiet=True))
    else:
        raise SystemExit("usage: board_link.py port")
