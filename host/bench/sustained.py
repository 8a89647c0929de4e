# host/bench/sustained.py: the rates a user's own loop sustains (`make bench` prints this table).
#   python host/bench/sustained.py [--callgrind]
# board/benchmarks/bench_sustained.py under the 32-bit port at the board's 512K heap: decode tokens/s and
# Iris training steps/s with a collection before each timed round (as bench.py measures) and
# without (as a user's loop runs), and the heap bytes each allocates; with --callgrind, the
# instructions per training sample at a 512K and a 64M heap next to the seed's C++.
import os
import re
import subprocess
import sys

import bench_common as bench

SEED = {"iris": 54.3e3, "block": 16.0e6}     # the seed's C++ per training sample (shared/FACTS.md)
_BIG = "2M"                                  # the heap a run that does not fit the board's is repeated in


def _line(exe, heap, what, n):
    env = dict(os.environ, MICROPYPATH=os.pathsep.join([os.path.join(bench.ROOT, "lib")] + bench.BOARD_PATH))
    cmd = [exe, "-X", "heapsize=" + heap, os.path.join(bench.ROOT, "board", "benchmarks", "bench_sustained.py"), what, "viper", str(n)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    m = re.search(r"^SUSTAINED \S+ \S+ \d+ (\S+) (\S+) (-?\d+)$", out.stdout, re.M)
    if m:
        return float(m.group(1)), float(m.group(2)), int(m.group(3)), None
    text = out.stdout + out.stderr
    why = "out of memory" if "MemoryError" in text else (text.strip().splitlines() or ["failed"])[-1]
    return None, None, None, "%s (%s)" % (why, " ".join(cmd))


def table(exe=bench.MP32, heap="512K", rounds=200, steps=300):
    """Collected vs sustained rates at `heap` on `exe` (default the 32-bit port)."""
    print("sustained rates, viper, %s at -X heapsize=%s (%d decode rounds of %d tokens, %d Iris steps):"
          % (os.path.basename(exe), heap, rounds, 48, steps), flush=True)
    print("  %-20s %12s %12s %8s %12s" % ("", "collected", "sustained", "ratio", "heap B/call"), flush=True)
    out = {}
    for what, n, unit in (("decode", rounds, "tokens/s"), ("fit", steps, "steps/s")):
        col, sus, per, err = _line(exe, heap, what, n)
        out[what] = (col, sus, per, err)           # at `heap`, not the retry's
        name = "%s %s" % (what, unit)
        if err:
            print("  %-20s %s" % (name, err), flush=True)
            if heap != _BIG:                   # the same rounds where they fit, said as such
                col, sus, per, err = _line(exe, _BIG, what, n)
                name = "  (at %s)" % _BIG
        if not err:
            print("  %-20s %12.1f %12.1f %7.0f%% %12d" % (name, col, sus, 100.0 * sus / col, per), flush=True)
        else:
            print("  %-20s %s" % (name, err), flush=True)
    return out


def instructions(exe=bench.MP32, heaps=("512K", "64M")):
    """Instructions per training sample (callgrind, runs of two lengths, no collection between
    steps) at each heap size, next to the seed's C++."""
    print("instructions per training sample, viper, %s:" % os.path.basename(exe), flush=True)
    got = {}
    for heap in heaps:
        for model, batch, (s0, s1) in (("iris", 16, (5, 25)), ("block", 8, (1, 3))):
            a = bench._callgrind_ir(model, "viper", s0, heap, exe)
            b = bench._callgrind_ir(model, "viper", s1, heap, exe)
            if a and b:
                per = got[model, heap] = (b - a) / float((s1 - s0) * batch)
                print("  %-5s -X heapsize=%-4s %10.1fk  (x%.1f the seed's C++ %.1fk)"
                      % (model, heap, per / 1e3, per / SEED[model], SEED[model] / 1e3), flush=True)
            else:
                print("  %-5s -X heapsize=%-4s callgrind gave no count" % (model, heap), flush=True)
    return got


def goals(result):
    """host/bench/bench_goals.py's figures from what main() returned: the sustained decode ratio and
    whether decoding ran at all at the 512K heap, Iris (512K) and the E=64 block (64M) against the
    seed's C++; a string where there is no figure."""
    col, sus, _, err = result["rates"]["decode"]
    out = {"decode_sustained": sus / col if not err else err, "decode_512k": 0 if err else 1}
    ir = result.get("instructions")
    for key, model, heap in (("iris_x", "iris", "512K"), ("block_x", "block", "64M")):
        if ir is None:
            out[key] = "not counted (this run had no --callgrind: it is given when valgrind is installed)"
        else:
            per = ir.get((model, heap))
            out[key] = per / SEED[model] if per else "callgrind gave no count"
    return out


def main(argv=()):
    """The rates table and, with --callgrind, the instruction counts: {"rates": table(),
    "instructions": instructions() or None}."""
    if not os.path.exists(bench.MP32):
        raise SystemExit("bench_sustained: needs the 32-bit port at %s (make mp32)" % bench.MP32)
    out = {"rates": table(), "instructions": None}
    if "--callgrind" in argv:
        out["instructions"] = instructions()
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
