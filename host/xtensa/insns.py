"""Xtensa instructions of real runs on the emulated core (QEMU -M sim -cpu de233_fpu, counted by
host/xtensa/insn_plugin.c), for `make bench`: per Iris training sample, per E=64 block training
sample, per decoded token and per Adam parameter, on viper and (but the decode) on the C kernels, each the difference of two runs of the same
script with different amounts of work (so the boot, imports and warm-up cancel), next to the
x86 count of the same two runs on the 32-bit unix port under callgrind when valgrind is there.

QEMU counts executed instructions, not cycles: an ESP32-S3 spends more than one cycle on loads
from PSRAM, taken branches, multiplies and divides; instruction counts are not board time.

    python host/xtensa/insns.py [--no-x86] [NAME ...]     (NAME: iris, iris_native, block, ...)

The native rows run the C kernels' module a board gets (build/native/xtensawin/mf_native.mpy,
`make native`) there, and the x86 module (build/native/x86) on the 32-bit port.
"""
import os
import re
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "host" / "bench"))
import run as xrun  # noqa: E402

MP32 = ROOT / "build" / "mp32" / "micropython32-sp"
NOTE = "QEMU counts instructions, not cycles"

NATIVE = ROOT / "build" / "native"
# the C kernels' modules (make native): the board's file on the emulated core, x86's on the 32-bit port
NATIVE_XTENSA = NATIVE / "xtensawin" / "mf_native.mpy"
NATIVE_X86 = NATIVE / "x86"

# name, script, (args of the smaller run, args of the larger), units of work between them, unit;
# the native rows load build/native/xtensawin/mf_native.mpy there (and x86's on the 32-bit port)
MEASURES = (
    ("iris", "board/benchmarks/bench.py", (["iris", "viper", "5", "1"], ["iris", "viper", "25", "1"]), 20 * 16,
     "per Iris training sample (viper, batch 16)"),
    ("iris_native", "board/benchmarks/bench.py", (["iris", "native", "5", "1"], ["iris", "native", "25", "1"]), 20 * 16,
     "per Iris training sample (native, batch 16)"),
    ("block", "board/benchmarks/bench.py", (["block", "viper", "1", "1"], ["block", "viper", "3", "1"]), 2 * 8,
     "per E=64 block training sample (viper, batch 8)"),
    ("block_native", "board/benchmarks/bench.py", (["block", "native", "1", "1"], ["block", "native", "3", "1"]), 2 * 8,
     "per E=64 block training sample (native, batch 8)"),
    ("decode", "host/xtensa/decode_steps_mp.py", (["8"], ["40"]), 32,
     "per decoded token (viper, bench.py's decode stack, KV cache)"),
    ("adam", "board/benchmarks/bench.py", (["opt", "viper", "adam", "10"], ["opt", "viper", "adam", "20"]), None,
     "per parameter per Adam step (viper, Iris model)"),
    ("adam_native", "board/benchmarks/bench.py", (["opt", "native", "adam", "10"], ["opt", "native", "adam", "20"]), None,
     "per parameter per Adam step (native, Iris model)"),
)


def _adam_params(out):
    m = re.search(r"^OPT \S+ \d+ (\d+)$", out or "", re.M)
    return int(m.group(1)) if m else None


def xtensa_count(script, args, heap=8 * 1024 * 1024, native=False):
    """(instructions, output) of one run on the emulated core (with the board's C-kernel module in
    /lib when native); instructions None when it failed."""
    files = [str(NATIVE_XTENSA) + ":/lib/mf_native.mpy"] if native else []
    status, out, n = xrun.run(str(ROOT / script), args, lib=True, board=True, heap=heap, files=files,
                              count_insns=True, capture=True, timeout=1800)
    return (n if status == 0 else None), out


def x86_count(script, args, native=False):
    """(instructions, output) of the same run on the 32-bit unix port under callgrind (with the x86
    C-kernel module on its path when native), or (None, why)."""
    if not MP32.is_file() or not shutil.which("valgrind"):
        return None, "no 32-bit port or no valgrind"
    import bench_common as bench
    path = [str(ROOT / "lib")] + [str(ROOT / "board" / d) for d in ("", "demos", "benchmarks")] + ([str(NATIVE_X86)] if native else [])
    env = dict(os.environ, MICROPYPATH=os.pathsep.join(path),
               PYTHONHASHSEED="0")
    ir, r = bench.callgrind([str(MP32), "-X", "heapsize=8M", str(ROOT / script)] + list(args), env, 3600,
                            cwd=str(ROOT))
    return (ir if r.returncode == 0 else None), r.stdout + r.stderr


def measure(with_x86=True, only=None):
    """{name: (xtensa per unit, x86 per unit or None, unit text)}; a failed count is None, a native
    row without build/native/xtensawin/mf_native.mpy is left out (table() says so)."""
    res = {}
    for name, script, (small, large), units, what in MEASURES:
        if only and name not in only:
            continue
        native = name.endswith("_native")
        if native and not NATIVE_XTENSA.is_file():
            continue
        (a, _), (b, out_b) = xtensa_count(script, small, native=native), xtensa_count(script, large, native=native)
        n = units
        if name.startswith("adam"):
            p = _adam_params(out_b)
            n = 10 * p if p else None
        xt = (b - a) / n if (a and b and n) else None
        x86 = None
        if with_x86:
            if native and not (NATIVE_X86 / "mf_native.mpy").is_file():
                c = d = None
            else:
                (c, _), (d, _) = x86_count(script, small, native), x86_count(script, large, native)
            x86 = (d - c) / n if (c and d and n) else None
        res[name] = (xt, x86, what)
    return res


def table(with_x86=True, only=None):
    print("Xtensa instructions on the emulated core (QEMU -M sim -cpu de233_fpu, host/xtensa; %s;"
          " x86: the same runs on the 32-bit unix port under callgrind):" % NOTE, flush=True)
    if not NATIVE_XTENSA.is_file():
        print("  native rows: not counted, %s is missing (make native)" % os.path.relpath(NATIVE_XTENSA, ROOT), flush=True)
    res = measure(with_x86, only)
    for name, (xt, x86, what) in res.items():
        if xt is None:
            print("  %s: the emulated run failed, no count" % what, flush=True)
            continue
        ratio = " (x86 %s, Xtensa/x86 %.2f)" % (_k(x86), xt / x86) if x86 else " (x86: not counted)"
        print("  %s: %s Xtensa instructions%s" % (what, _k(xt), ratio), flush=True)
    return res


def _k(n):
    return "%.1fk" % (n / 1000.0) if n >= 1000 else "%.0f" % n


if __name__ == "__main__":
    table("--no-x86" not in sys.argv, [a for a in sys.argv[1:] if not a.startswith("--")] or None)
