"""make deploy: precompile lib/microformer for the board's architecture and copy it, the REPL
entry points, the data and the demo checkpoint to the board's flash.

    python host/deploy.py [--port /dev/ttyACM0] [--checkpoint build/iris.mfck] [--force]

Without --port (or PORT) the virtual board is the target, started when needed. mpremote skips
files whose SHA-256 already matches, so a second deploy sends only what changed.

The board's checkpoint is the user's work once it is fine-tuned there (s.save()). Next to it,
deploy records the SHA-256 of what it copied (/iris.mfck.deployed). A board checkpoint that
differs from that record (changed on the board, or of unknown origin) is never replaced
silently: it is renamed to /iris.mfck.bak (then .bak2, ...; a board may have no clock) and
deploy says so. --force (make deploy FORCE=1) replaces it without keeping a copy.
"""
import argparse
import hashlib
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


# Runs on the board before the checkpoint is copied: keep a checkpoint changed on the board.
# %(name)r: the board path; %(new)r: SHA-256 of the file about to be copied; %(mode)r: 'keep'
# or 'force'. MISSING instead installs NAME.new as NAME only when the board has no NAME.
KEEP = """import os, hashlib, binascii
def _sha(p):
    h = hashlib.sha256()
    b = bytearray(512)
    with open(p, 'rb') as f:
        while True:
            n = f.readinto(b)
            if not n:
                break
            h.update(b[:n])
    return binascii.hexlify(h.digest()).decode()
def _have(p):
    try:
        os.stat(p)
        return True
    except OSError:
        return False
name, new, mode = %(name)r, %(new)r, %(mode)r
cur = _sha(name) if _have(name) else None
rec = open(name + '.deployed').read().strip() if _have(name + '.deployed') else None
if cur is None:
    print('CKPT new')
elif mode == 'missing':
    print('CKPT present')
elif cur == new:
    print('CKPT same')
elif cur == rec:
    print('CKPT unchanged')
elif mode == 'force':
    print('CKPT forced')
else:
    k = name + '.bak'
    i = 2
    while _have(k):
        k = '%%s.bak%%d' %% (name, i)
        i += 1
    os.rename(name, k)
    print('CKPT kept', k)
"""

MISSING = ("import os\ntry:\n os.stat(%(name)r)\n os.remove(%(name)r + '.new')\n print('CKPT present')\n"
           "except OSError:\n os.rename(%(name)r + '.new', %(name)r)\n"
           " open(%(name)r + '.deployed', 'w').write(%(new)r)\n print('CKPT new')")

RECORD = ("import os\ntry:\n os.stat(%(name)r)\n open(%(name)r + '.deployed', 'w').write(%(new)r)\n"
          "except OSError:\n pass")


def sha256_file(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def checkpoint_report(out, name):
    """What happened to the board's checkpoint, from KEEP's output line, for the user."""
    m = [line.split()[1:] for line in out.splitlines() if line.startswith("CKPT ")]
    if not m:
        return None
    what = m[-1]
    if what[0] == "kept":
        return ("kept the board's %s as %s: it was changed on the board since the last deploy "
                "(e.g. s.save() after a fine-tune); finetune.Session(%r) loads it. "
                "The host's checkpoint is now %s (make deploy FORCE=1 replaces without keeping)"
                % (name, what[1], what[1].lstrip("/"), name))
    return {"new": "copied the checkpoint to %s" % name,
            "same": "%s is already the host's checkpoint" % name,
            "unchanged": "replaced %s (not changed on the board since the last deploy)" % name,
            "forced": "FORCE: replaced %s, which was changed on the board, without keeping it" % name,
            "present": "left the board's %s as it is" % name}[what[0]]


def deploy(port, checkpoint=None, data=("iris.csv",), force=False, checkpoint_mode=None,
           extra=()):
    """Copy the package, board/*.py, data and `checkpoint` (to the flash root).

    checkpoint_mode: 'keep' (default: a checkpoint changed on the board is renamed to .bak),
    'force' (replace it), 'missing' (copy only if the board has none).
    extra: more (local file, board path) pairs to copy, e.g. the demo's own checkpoint.
    """
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
    name = None
    if checkpoint:
        name = "/" + Path(checkpoint).name
        mode = checkpoint_mode or ("force" if force else "keep")
        new = sha256_file(checkpoint)
        if mode == "missing":
            # cp would overwrite: send it under another name, the board keeps what it has
            args += ["cp", str(checkpoint), ":" + name + ".new", "+",
                     "exec", MISSING % {"name": name, "new": new}, "+"]
        else:
            args += ["exec", KEEP % {"name": name, "new": new, "mode": mode}, "+",
                     "cp", str(checkpoint), ":" + name, "+",
                     "exec", RECORD % {"name": name, "new": new}, "+"]
    for local, remote in extra:
        d = remote.rsplit("/", 1)[0]
        if d:
            args += ["exec", "import os\ntry:\n os.mkdir(%r)\nexcept OSError:\n pass" % d, "+"]
        args += ["cp", str(local), ":" + remote, "+"]
    # drop modules left over from an older version (a stale .py would shadow its .mpy)
    cleanup = ("import os\nkeep = %r\nfor f in os.listdir('/lib/microformer'):\n"
               " if f not in keep:\n  os.remove('/lib/microformer/' + f); print('removed stale', f)\n"
               "import microformer\nprint('microformer', microformer.__version__, 'backends:',"
               " microformer.available_backends())") % (names,)
    args += ["exec", cleanup]
    out = mpremote(port, *args, timeout=300)
    print("\n".join(line for line in out.splitlines() if not line.startswith("CKPT ")))
    if name:
        note = checkpoint_report(out, name)
        if note:
            print(note)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", default=None, help="serial port of a board; empty: the virtual board")
    ap.add_argument("--heap", default=None, help="virtual board heap when it has to be started")
    ap.add_argument("--checkpoint", default=None, help="a checkpoint to copy to the flash root")
    ap.add_argument("--data", default="iris.csv", help="files of datasets/ to copy to :/data/ (space separated)")
    ap.add_argument("--force", action="store_true",
                    help="replace a board checkpoint that was changed on the board, without keeping a copy")
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
    deploy(port, ck, data, force=a.force)


if __name__ == "__main__":
    main()
