#!/usr/bin/env python3
"""Run a MicroPython script on the emulated Xtensa core (QEMU `-M sim -cpu de233_fpu`).

    python host/xtensa/run.py SCRIPT [ARGS...]  [--lib] [--board] [--file SRC[:DEST]] [--heap N]

The script and the files it needs are packed into a bundle that the firmware copies into a
littlefs file system on a RAM disk (as a board's flash): --lib puts lib/microformer under
/lib/microformer, --board puts board/*.py, board/demos/*.py and board/benchmarks/*.py at /, --file SRC[:DEST] any other file (for example a
dynamic native module's .mpy: `--file build/mymod.mpy:/lib/mymod.mpy`, then `import mymod`).
The script runs as /main.py with sys.path ['', '/lib', '.frozen'], as on a board. Its output is
this program's output and its exit status is this program's (SystemExit, 1 for an uncaught
exception, 4 for a CPU exception such as an illegal instruction, 124 after --timeout seconds).

--count-insns: also count the instructions the emulated core executes (QEMU's TCG plugin
libinsn.so, built by `make xtensa-port` when QEMU's plugin API header is available) and print
`XTENSA-INSNS <n>` on stderr; counts include the boot (file-system setup) — subtract a run of
an empty script.
"""
import argparse
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build" / "xtensa"
FIRMWARE = BUILD / "firmware.elf"
MAGIC = b"MFXB1\n"


def bundle_files(script, lib=False, board=False, files=()):
    """[(dest, bytes)]: the script as /main.py and the files asked for."""
    out = []
    if lib:
        for p in sorted((ROOT / "lib" / "microformer").glob("*.py")):
            out.append(("/lib/microformer/" + p.name, p.read_bytes()))
    if board:
        for p in sorted((p for d in ("", "demos", "benchmarks") for p in (ROOT / "board" / d).glob("*.py")),
                        key=lambda p: p.name):
            out.append(("/" + p.name, p.read_bytes()))
    for spec in files:
        src, _, dest = spec.partition(":")
        p = Path(src)
        if not p.is_file():
            raise SystemExit("run.py: --file %s: no such file" % src)
        out.append((dest or "/" + p.name, p.read_bytes()))
    out.append(("/main.py", Path(script).read_bytes()))
    return out


def write_bundle(path, files):
    with open(path, "wb") as f:
        f.write(MAGIC)
        for name, data in files:
            if not name.startswith("/"):
                raise SystemExit("run.py: destination %r must be an absolute path" % name)
            n = name.encode()
            f.write(struct.pack("<H", len(n)) + n + struct.pack("<I", len(data)) + data)


def qemu_command(bundle, args, heap=None, disk=None, plugin=None, firmware=FIRMWARE):
    cmdline = []
    if heap:
        cmdline += ["--heap", str(heap)]
    if disk:
        cmdline += ["--disk", str(disk)]
    cmdline += [str(bundle), "/main.py"] + list(args)
    for a in cmdline:
        if " " in a or "," in a:
            raise SystemExit("run.py: argument %r: spaces and commas cannot be passed to QEMU" % a)
    cmd = ["qemu-system-xtensa", "-M", "sim", "-cpu", "de233_fpu", "-m", "128M", "-nographic",
           "-monitor", "none", "-serial", "none", "-semihosting",
           "-kernel", str(firmware), "-append", " ".join(cmdline)]
    if plugin:
        cmd[1:1] = ["-plugin", str(plugin), "-d", "plugin"]
    return cmd


def run(script, args=(), lib=False, board=False, files=(), heap=None, disk=None, timeout=600,
        count_insns=False, capture=False):
    """Run SCRIPT on the emulated core; return (exit status, output or None, instructions or None)."""
    if not FIRMWARE.is_file():
        raise SystemExit("run.py: %s is missing: run `make xtensa-port`" % FIRMWARE)
    plugin = None
    if count_insns:
        plugin = BUILD / "libinsn.so"
        if not plugin.is_file():
            raise SystemExit("run.py: %s is missing: `make xtensa-port` builds it" % plugin)
    with tempfile.TemporaryDirectory(prefix="xtensa-run-") as tmp:
        bundle = Path(tmp) / "bundle.bin"
        write_bundle(bundle, bundle_files(script, lib, board, files))
        cmd = qemu_command(bundle, args, heap, disk, plugin)
        logf = Path(tmp) / "plugin.log"
        if plugin:
            cmd[1:1] = ["-D", str(logf)]
        try:
            p = subprocess.run(cmd, stdin=subprocess.DEVNULL, timeout=timeout,
                               stdout=subprocess.PIPE if capture else None)
            status = p.returncode
            out = p.stdout.decode(errors="replace") if capture else None
        except subprocess.TimeoutExpired as e:
            status = 124
            out = (e.stdout or b"").decode(errors="replace") if capture else None
            msg = "run.py: timed out after %s s\n" % timeout
            if capture:
                out += msg
            else:
                sys.stderr.write(msg)
        insns = None
        if plugin and logf.is_file():
            for line in logf.read_text().splitlines():
                if line.startswith("insns:") or line.startswith("total insns:"):
                    insns = int(line.split(":")[1])
    return status, out, insns


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("script")
    ap.add_argument("args", nargs="*")
    ap.add_argument("--lib", action="store_true", help="lib/microformer under /lib")
    ap.add_argument("--board", action="store_true", help="board/*.py at /")
    ap.add_argument("--file", action="append", default=[], metavar="SRC[:DEST]")
    ap.add_argument("--heap", type=int, default=None, help="GC heap bytes (default 8 MB)")
    ap.add_argument("--disk", type=int, default=None, help="RAM disk bytes (default 4 MB)")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--count-insns", action="store_true")
    a = ap.parse_args(argv)
    status, _, insns = run(a.script, a.args, a.lib, a.board, a.file, a.heap, a.disk, a.timeout,
                           a.count_insns)
    if a.count_insns:
        sys.stderr.write("XTENSA-INSNS %s\n" % insns)
    return status


if __name__ == "__main__":
    sys.exit(main())
