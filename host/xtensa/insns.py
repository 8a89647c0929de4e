"""Xtensa instructions of real runs on the emulated core (QEMU -M sim -cpu de233_fpu, counted by
host/xtensa/insn_plugin.c), for `make bench`: per Iris training sample, per E=64 block training
sample, per decoded token and per Adam parameter, each the difference of two runs of the same
script with different amounts of work (so the boot, imports and warm-up cancel), next to the
x86 count of the same two runs on the 32-bit unix port under callgrind when valgrind is there.

QEMU counts executed instructions, not cycles: an ESP32-S3 spends more than one cycle on loads
from PSRAM, taken branches, multiplies and divides; instruction counts are not board time.

    python host/xtensa/insns.py
"""
import os
import re
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "host"))
import run as xrun  # noqa: E402

MP32 = ROOT / "build" / "mp32" / "micropython32-sp"
NOTE = "QEMU counts instructions, not cycles"

# name, script, (args of the smaller run, args of the larger), units of work between them, unit
MEASURES = (
    ("iris", "board/bench.py", (["iris", "viper", "5", "1"], ["iris", "viper", "25", "1"]), 20 * 16,
     "per Iris training sample (viper, batch 16)"),
    ("block", "board/bench.py", (["block", "viper", "1", "1"], ["block", "viper", "3", "1"]), 2 * 8,
     "per E=64 block training sample (viper, batch 8)"),
    ("decode", "host/xtensa/decode_steps_mp.py", (["8"], ["40"]), 32,
     "per decoded token (viper, bench.py's decode stack, KV cache)"),
    ("adam", "board/bench.py", (["opt", "viper", "adam", "10"], ["opt", "viper", "adam", "20"]), None,
     "per parameter per Adam step (viper, Iris model)"),
)


def _adam_params(out):
    m = re.search(r"^OPT \S+ \d+ (\d+)$", out or "", re.M)
    return int(m.group(1)) if m else None


def xtensa_count(script, args, heap=8 * 1024 * 1024):
    """(instructions, output) of one run on the emulated core; instructions None when it failed."""
    status, out, n = xrun.run(str(ROOT / script), args, lib=True, board=True, heap=heap,
                              count_insns=True, capture=True, timeout=1800)
    return (n if status == 0 else None), out


def x86_count(script, args):
    """(instructions, output) of the same run on the 32-bit unix port under callgrind, or (None, why)."""
    if not MP32.is_file() or not shutil.which("valgrind"):
        return None, "no 32-bit port or no valgrind"
    import bench
    env = dict(os.environ, MICROPYPATH=os.pathsep.join([str(ROOT / "lib"), str(ROOT / "board")]),
               PYTHONHASHSEED="0")
    ir, r = bench.callgrind([str(MP32), "-X", "heapsize=8M", str(ROOT / script)] + list(args), env, 3600,
                            cwd=str(ROOT))
    return (ir if r.returncode == 0 else None), r.stdout + r.stderr


def measure(with_x86=True):
    """{name: (xtensa per unit, x86 per unit or None, unit text)}; a failed count is None."""
    res = {}
    for name, script, (small, large), units, what in MEASURES:
        (a, _), (b, out_b) = xtensa_count(script, small), xtensa_count(script, large)
        n = units
        if name == "adam":
            p = _adam_params(out_b)
            n = 10 * p if p else None
        xt = (b - a) / n if (a and b and n) else None
        x86 = None
        if with_x86:
            (c, _), (d, _) = x86_count(script, small), x86_count(script, large)
            x86 = (d - c) / n if (c and d and n) else None
        res[name] = (xt, x86, what)
    return res


def table(with_x86=True):
    print("Xtensa instructions on the emulated core (QEMU -M sim -cpu de233_fpu, host/xtensa; %s;"
          " x86: the same runs on the 32-bit unix port under callgrind):" % NOTE, flush=True)
    res = measure(with_x86)
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
    table("--no-x86" not in sys.argv)
