# host/bench/bench_native.py: the native backend (the C kernels of host/native/, `make native`) beside viper,
# inside both unix ports: ms per training step (board/benchmarks/bench.py), and with valgrind the instructions
# callgrind counts on the 32-bit port with the x86 module, the figures of the speed goals:
#   Iris instructions per training sample (a difference of two runs, 5 and 25 steps of batch 16),
#   the E=64 block's (1 and 3 steps of batch 8), Adam per parameter per opt.step() on the Iris model
#   (board/benchmarks/bench.py opt: 475 parameters, so optim.py's per-step Python counts) and on a
#   33k-parameter model (two Dense(128, 128)), where the kernel's own cost shows.
#   python host/bench/bench_native.py            (make bench runs it; make native builds the modules)
# main() returns {goal key: figure or the reason there is none} for host/bench/bench_goals.py.
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bench  # noqa: E402
from sustained import SEED  # noqa: E402

ROOT = bench.ROOT
ARCH = {64: "x64", 32: "x86"}
ADAM_33K = """
import sys
import microformer as mf
mf.set_backend(sys.argv[1] if len(sys.argv) > 1 else 'native')
model = mf.Sequential([mf.Dense(128, 128), mf.Dense(128, 128)])
opt = mf.Adam(model, lr=1e-3)
for p, g in model.parameters():
    for i in range(len(g.data)):
        g.data[i] = 0.001 * (i % 7 - 3)
for _ in range(int(sys.argv[2])):
    opt.step()
print('OPT adam', sys.argv[2], sum(len(p.data) for p, g in model.parameters()))
"""


def module_dir(bits):
    d = os.path.join(ROOT, "build", "native", ARCH[bits])
    return d if os.path.exists(os.path.join(d, "mf_native.mpy")) else None


def _env(folder):
    return dict(os.environ, MICROPYPATH=os.pathsep.join([os.path.join(ROOT, "lib"), folder]), PYTHONHASHSEED="0")


def step_ms(exe, folder, model, backend, heap="64M"):
    """(ms per step, us per sample) of board/benchmarks/bench.py MODEL BACKEND (fastest of its rounds)."""
    cmd = [exe, "-X", "heapsize=" + heap, os.path.join(ROOT, "board", "benchmarks", "bench.py"), model, backend]
    r = subprocess.run(cmd, env=_env(folder), capture_output=True, text=True, timeout=1800)
    m = re.search(r"^RESULT \S+ \S+ \d+ (\S+) \S+ \S+ \S+ \S+ \S+ (\S+)$", r.stdout, re.M)
    if r.returncode or not m:
        raise SystemExit("bench_native failed: %s\n%s%s" % (" ".join(cmd), r.stdout, r.stderr))
    return float(m.group(1)), float(m.group(2))


def per_sample(exe, folder, model, backend, steps, batch, heap):
    """Instructions per training sample: the difference of two callgrind runs over their steps."""
    counts = []
    for s in steps:
        cmd = [exe, "-X", "heapsize=" + heap, os.path.join(ROOT, "board", "benchmarks", "bench.py"), model, backend, str(s), "1"]
        ir, r = bench.callgrind(cmd, _env(folder), 3600)
        if r.returncode or not ir or not re.search(r"^RESULT ", r.stdout, re.M):
            return None
        counts.append(ir)
    return (counts[1] - counts[0]) / float((steps[1] - steps[0]) * batch)


def adam_per_param(exe, folder, backend, big, n=10):
    """Instructions per parameter per Adam opt.step(): runs of n and 2n steps."""
    counts, params = [], None
    for s in (n, 2 * n):
        if big:
            cmd = [exe, "-X", "heapsize=16M", "-c", ADAM_33K, backend, str(s)]
        else:
            cmd = [exe, os.path.join(ROOT, "board", "benchmarks", "bench.py"), "opt", backend, "adam", str(s)]
        ir, r = bench.callgrind(cmd, _env(folder), 3600)
        p = re.search(r"^OPT \S+ \d+ (\d+)$", r.stdout, re.M)
        if r.returncode or not ir or not p:
            return None
        counts.append(ir)
        params = int(p.group(1))
    return (counts[1] - counts[0]) / float(n * params)


def main(argv=()):
    goals = {}
    missing = "build/native/x86/mf_native.mpy is not built (make native)"
    print("== native backend (C kernels, host/native/) beside viper", flush=True)
    for name, exe, bits in bench.interpreters():
        folder = module_dir(bits)
        if not folder:
            print("  %s: no build/native/%s/mf_native.mpy (make native): no native rows" % (name, ARCH[bits]))
            continue
        print("%s, module %s:" % (name, os.path.relpath(folder, ROOT)), flush=True)
        print("  %-6s %-7s %9s %10s %8s" % ("model", "backend", "ms/step", "us/sample", "speedup"), flush=True)
        for b in ("viper", "native"):
            cmd = [exe, "-X", "heapsize=8M", os.path.join(ROOT, "board", "benchmarks", "bench.py"), "decode", b]
            tps, per = bench._decode_run(cmd, _env(folder))
            print("  decode %-7s %9.0f tokens/s, %s B per token (board/benchmarks/bench.py decode: greedy, KV cache)"
                  % (b, tps, "%.0f" % per if per >= 0 else "n/a"), flush=True)
        for model in ("iris", "block"):
            rows = {b: step_ms(exe, folder, model, b) for b in ("viper", "native")}
            for b in ("viper", "native"):
                print("  %-6s %-7s %9.3f %10.1f %8s" % (model, b, rows[b][0], rows[b][1],
                                                        "x%.1f" % (rows["viper"][0] / rows[b][0]) if b == "native" else ""),
                      flush=True)
    mp32 = [(exe, bits) for _, exe, bits in bench.interpreters() if bits == 32]
    if not mp32:
        return dict.fromkeys(("iris_native_x", "block_native_x", "adam_native_mp32"),
                             "the 32-bit port is not built (make mp32)")
    exe = mp32[0][0]
    folder = module_dir(32)
    if not folder:
        return dict.fromkeys(("iris_native_x", "block_native_x", "adam_native_mp32"), missing)
    if not shutil.which("valgrind"):
        return dict.fromkeys(("iris_native_x", "block_native_x", "adam_native_mp32"), "valgrind is not installed")
    print("callgrind, 32-bit port, x86 module (instructions):", flush=True)
    for model, batch, steps, heap, key in (("iris", 16, (5, 25), "512K", "iris_native_x"),
                                           ("block", 8, (1, 3), "64M", "block_native_x")):
        for backend in ("native", "viper"):
            ir = per_sample(exe, folder, model, backend, steps, batch, heap)
            if ir is None:
                print("  %s %s: callgrind gave no count" % (model, backend), flush=True)
                if backend == "native":
                    goals[key] = "callgrind gave no count"
                continue
            print("  %s %s: %.1fk per training sample (batch %d, -X heapsize=%s), x%.2f the seed's C++ (%.1fk)"
                  % (model, backend, ir / 1e3, batch, heap, ir / SEED[model], SEED[model] / 1e3), flush=True)
            if backend == "native":
                goals[key] = ir / SEED[model]
    for backend in ("native", "viper"):
        for big in (False, True):
            ir = adam_per_param(exe, folder, backend, big)
            what = "33,024 parameters (two Dense(128, 128))" if big else "the Iris model, 475 parameters"
            print("  Adam %s: %s per parameter per opt.step(), %s" % (backend, "%.1f" % ir if ir else "no count", what),
                  flush=True)
            if backend == "native":
                goals["adam_native_mp32_big" if big else "adam_native_mp32"] = ir if ir else "callgrind gave no count"
    return goals


if __name__ == "__main__":
    import bench_goals
    bench_goals.table(main(sys.argv[1:]))
