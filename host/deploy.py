"""make deploy: precompile lib/microformer for the board's architecture and copy it, the REPL
entry points, the data and the demo checkpoint to the board's flash.

    python host/deploy.py [--port /dev/ttyACM0] [--checkpoint build/iris.mfck]

Without --port (or PORT) the virtual board is the target, started when needed. mpremote skips
files whose SHA-256 already matches, so a second deploy sends only what changed.
"""
import argparse
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from board_link import ROOT, board_lib_files, board_mpy, mpremote, resolve_port, tool  # noqa: E402
from gen_viper import MODULES as _VIPER_MODULES  # noqa: E402

BUILD = ROOT / "build" / "deploy"
# the viper kernel namespace and the generated modules it gathers (native code)
VIPER_FILES = ("kernels_viper.py",) + tuple("viper_%s.py" % n for n in _VIPER_MODULES)


def compile_lib(arch):
    """lib/microformer/*.py -> build/deploy/<arch>/lib/microformer/*.mpy; returns that lib folder."""
    out = BUILD / (arch or "bytecode") / "lib" / "microformer"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for src in board_lib_files():
        if arch is None and src.name in VIPER_FILES:
            continue   # a port without native code cannot load viper kernels
        # -s: tracebacks on the board name microformer/x.py, not this machine's path
        cmd = [tool("mpy-cross")] + (["-march=" + arch] if arch else []) + \
              ["-s", "microformer/" + src.name, "-o", str(out / (src.stem + ".mpy")), str(src)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            raise SystemExit("mpy-cross failed on %s:\n%s" % (src, r.stderr))
    return out


def deploy(port, checkpoint=None, data=("iris.csv",)):
    mpy, sub, arch = board_mpy(port)
    if mpy != 6:
        raise SystemExit("the board loads .mpy version %d; this mpy-cross writes version 6 "
                         "(MicroPython >= 1.23): update the firmware (make flash)" % mpy)
    libdir = compile_lib(arch)
    names = sorted(p.name for p in libdir.iterdir())
    print("deploying %d modules compiled for %s" % (len(names), arch or "bytecode (no native emitter)"))
    args = ["cp", "-r", str(libdir.parent) + "/", ":/", "+"]
    for f in sorted((ROOT / "board").glob("*.py")):
        args += ["cp", str(f), ":/" + f.name, "+"]
    args += ["exec", "import os\ntry:\n os.mkdir('/data')\nexcept OSError:\n pass", "+"]
    for d in data:
        args += ["cp", str(ROOT / "datasets" / d), ":/data/" + d, "+"]
    goldens = sorted((ROOT / "tests" / "golden").glob("*.mfg"))
    if goldens:   # golden vectors for selftest.py
        args += ["exec", "import os\ntry:\n os.mkdir('/golden')\nexcept OSError:\n pass", "+"]
        for g in goldens:
            args += ["cp", str(g), ":/golden/" + g.name, "+"]
    if checkpoint:
        args += ["cp", str(checkpoint), ":/" + Path(checkpoint).name, "+"]
    # drop modules left over from an older version (a stale .py would shadow its .mpy)
    cleanup = ("import os\nkeep = %r\nfor f in os.listdir('/lib/microformer'):\n"
               " if f not in keep:\n  os.remove('/lib/microformer/' + f); print('removed stale', f)\n"
               "import microformer\nprint('microformer', microformer.__version__, 'backends:',"
               " microformer.available_backends())") % (names,)
    args += ["exec", cleanup]
    out = mpremote(port, *args, timeout=300)
    print(out.rstrip())
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", default=None, help="serial port of a board; empty: the virtual board")
    ap.add_argument("--heap", default=None, help="virtual board heap when it has to be started")
    ap.add_argument("--checkpoint", default=None, help="a checkpoint to copy to the flash root")
    ap.add_argument("--data", default="iris.csv", help="files of datasets/ to copy to :/data/ (space separated)")
    a = ap.parse_args(argv)
    port = resolve_port(a.port, a.heap)
    ck = a.checkpoint
    if ck and not Path(ck).exists():
        raise SystemExit("checkpoint %s not found (make pretrain writes build/iris.mfck)" % ck)
    data = a.data.replace(",", " ").split()
    for d in data:
        if not (ROOT / "datasets" / d).exists():
            raise SystemExit("--data: datasets/%s not found (have: %s)" % (d, ", ".join(
                sorted(p.name for p in (ROOT / "datasets").glob("*.csv")))))
    deploy(port, ck, data)


if __name__ == "__main__":
    main()
