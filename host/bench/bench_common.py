# host/bench/bench_common.py: what the benchmarks share (host/bench/bench_all.py runs them all for
# `make bench`): board/benchmarks/bench.py run INSIDE MicroPython unix ports, both backends: the stock 64-bit
# port and, when built (`make mp32`), the 32-bit single-precision port, whose heap figures are the
# ESP32-like ones (object sizes, float width). The interpreters, callgrind, one run per
# (model, backend) so each peak-heap figure is its own, the smallest session heap. It imports no
# other benchmark: they import it.
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STOCK = os.environ.get("MICROPYTHON") or os.path.join(ROOT, ".venv", "bin", "micropython")
MP32 = os.environ.get("MICROPYTHON32") or os.path.join(ROOT, "build", "mp32", "micropython32-sp")
# what MICROPYPATH needs besides lib/ for the board's files: the session, the demos, the benchmarks
BOARD_PATH = [os.path.join(ROOT, "board")] + [os.path.join(ROOT, "board", d) for d in ("demos", "benchmarks")]
PEER = ("plain C++ of the seed's math (g++ -O2, see the README): Iris 54.3k instructions per training sample"
        " (a second such program: 41.5k), the E=64 block 13.4M")


def _run(exe, model, backend, heap, steps=None, prefix=()):
    env = dict(os.environ, MICROPYPATH=os.path.join(ROOT, "lib"))
    cmd = list(prefix) + [exe, "-X", "heapsize=" + heap, os.path.join(ROOT, "board", "benchmarks", "bench.py"), model, backend]
    if steps:
        cmd.append(str(steps))
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    m = re.search(r"^RESULT (.*)$", out.stdout, re.M)
    if out.returncode or not m:
        raise SystemExit("bench failed: %s\n%s%s" % (" ".join(cmd), out.stdout, out.stderr))
    f = m.group(1).split()
    return {"model": f[0], "backend": f[1], "steps": int(f[2]), "ms": float(f[3]), "fwd": float(f[4]),
            "bwd": float(f[5]), "opt": float(f[6]), "alloc": int(f[7]), "peak": int(f[8]),
            "us_sample": float(f[9])}


def callgrind(cmd, env, timeout, cwd=None):
    """(instructions callgrind counted for the whole run of `cmd`, or None when it printed no
    count; the CompletedProcess): the one place a bench runs a command under callgrind."""
    with tempfile.TemporaryDirectory() as d:
        full = ["valgrind", "--tool=callgrind", "--callgrind-out-file=" + os.path.join(d, "cg.out")] + list(cmd)
        r = subprocess.run(full, env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    m = re.search(r"Collected\s*:\s*(\d+)", r.stderr) or re.search(r"refs:\s*([\d,]+)", r.stderr)
    return (int(m.group(1).replace(",", "")) if m else None), r


def _callgrind_ir(model, backend, steps, heap, exe=STOCK):
    # total instructions of a whole run (startup + warmup + steps) under callgrind; None, with
    # the reason printed, when the run itself failed (a failed run's count measures nothing)
    env = dict(os.environ, MICROPYPATH=os.path.join(ROOT, "lib"), PYTHONHASHSEED="0")
    cmd = [exe, "-X", "heapsize=" + heap, os.path.join(ROOT, "board", "benchmarks", "bench.py"), model, backend, str(steps), "1"]
    ir, r = callgrind(cmd, env, 3600)
    if r.returncode or not re.search(r"^RESULT ", r.stdout, re.M):
        text = r.stdout + r.stderr
        why = "out of memory" if "MemoryError" in text else "exit status %d" % r.returncode
        print("  (%s %s, %d steps, -X heapsize=%s: the run failed, %s)" % (model, backend, steps, heap, why),
              flush=True)
        return None
    return ir


DECODE_WHAT = ("decode: Embedding -> PositionalEncoding -> EncoderBlock(E=32, H=2, causal, gelu) -> LayerNorm"
               " -> Dense, 16-token prompt, 48 new tokens (greedy, KV cache)")


def _decode_run(cmd, env):
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    m = re.search(r"^DECODE (\S+) (\S+) (\S+) (\S+)", out.stdout, re.M)
    if out.returncode or not m:
        raise SystemExit("bench decode failed: %s\n%s%s" % (" ".join(cmd), out.stdout, out.stderr))
    return float(m.group(3)), float(m.group(4))


def decode_table(exe=None, backends=("python", "viper"), heap="256M"):
    """Tokens per second of the decode stack per backend (the faster of two alternating runs each,
    the machine may be shared) and heap bytes per decoded token (gc.mem_alloc delta, GC off; the
    portable path needs a large heap for that). exe None: CPython."""
    print(DECODE_WHAT, flush=True)
    print("%-8s %12s %14s %8s" % ("backend", "tokens/s", "heap B/token", "speedup"), flush=True)
    best = {}
    for _ in range(2):
        for b in backends:
            if exe is None:
                env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "lib"))
                cmd = [sys.executable, os.path.join(ROOT, "board", "benchmarks", "bench.py"), "decode", b]
            else:
                env = dict(os.environ, MICROPYPATH=os.path.join(ROOT, "lib"))
                cmd = [exe, "-X", "heapsize=" + heap, os.path.join(ROOT, "board", "benchmarks", "bench.py"), "decode", b]
            tps, hb = _decode_run(cmd, env)
            if b not in best or tps > best[b][0]:
                best[b] = (tps, hb)
    base = best[backends[0]][0]
    for b in backends:
        tps, hb = best[b]
        print("%-8s %12.1f %14s %8s" % (b, tps, "%.0f" % hb if hb >= 0 else ("n/a" if hb == -2 else ">heap"),
                                         "x%.1f" % (tps / base) if b != backends[0] else ""), flush=True)
    return best


def fit_heap(exe):
    """Heap bytes per step of train.fit on Iris (whole epochs, the partial batch included), viper."""
    env = dict(os.environ, MICROPYPATH=os.pathsep.join([os.path.join(ROOT, "lib")] + BOARD_PATH))
    cmd = [exe, "-X", "heapsize=8M", os.path.join(ROOT, "board", "benchmarks", "bench.py"), "fitheap", "viper"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    m = re.search(r"^FITHEAP \S+ (\d+) (\S+) ", out.stdout, re.M)
    if out.returncode or not m:
        raise SystemExit("bench fitheap failed: %s\n%s%s" % (" ".join(cmd), out.stdout, out.stderr))
    return int(m.group(1)), float(m.group(2))


def opt_instructions(kind, backend="viper", n=20, exe=STOCK):
    """Instructions per parameter per optimizer step (callgrind, interpreter exe): runs of 2n and n
    steps on the Iris model's gradients, so startup and whatever a run does once cancel. The step is the whole opt.step():
    one kernel call for the new weights and state of every tensor (into the shadow buffers, with
    the check for non-finite values) and the copy into the live buffers. PYTHONHASHSEED is fixed:
    the `micropython` command of the pip package starts inside CPython, whose startup otherwise
    varies by some 10^5 instructions from run to run."""
    counts = []
    for steps in (n, 2 * n):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "cg.out")
            env = dict(os.environ, MICROPYPATH=os.path.join(ROOT, "lib"), PYTHONHASHSEED="0")
            cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=" + out, exe,
                   os.path.join(ROOT, "board", "benchmarks", "bench.py"), "opt", backend, kind, str(steps)]
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
            m = re.search(r"Collected\s*:\s*(\d+)", r.stderr)
            p = re.search(r"^OPT \S+ \d+ (\d+)$", r.stdout, re.M)
            if not m or not p:
                return None
            counts.append(int(m.group(1)))
    return (counts[1] - counts[0]) / float(n * int(p.group(1)))


def _kb(n):
    return "%.1f KB" % (n / 1024.0)


def memory(exe):
    """The MEM lines of board/benchmarks/bench.py (viper, the board's default backend) on interpreter `exe`."""
    env = dict(os.environ, MICROPYPATH=os.path.join(ROOT, "lib"))
    cmd = [exe, "-X", "heapsize=4M", os.path.join(ROOT, "board", "benchmarks", "bench.py"), "memory"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    got = dict((m.group(1), m.group(2).split()) for m in re.finditer(r"^MEM (\w+) (.*)$", out.stdout, re.M))
    if out.returncode or set(got) != {"import", "first_step", "per_step"}:
        raise SystemExit("bench memory failed: %s\n%s%s" % (" ".join(cmd), out.stdout, out.stderr))
    return got


def _session_runs(exe, flash, kb, path=None):
    """True when an Iris fine-tune session runs in a heap of `kb` KB; False on MemoryError; any
    other failure stops the bench. `path`: the folders MICROPYPATH names (lib/ and board/ by
    default: the .py sources)."""
    path = path or [os.path.join(ROOT, "lib")] + BOARD_PATH
    env = dict(os.environ, MICROPYPATH=os.pathsep.join(path))
    cmd = [exe, "-X", "heapsize=%dK" % kb, "-c", "import bench; bench.session(%r)" % flash]
    # cwd: the flash folder (-c puts the cwd first on sys.path: only board/benchmarks/bench.py may answer to `bench`)
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=flash)
    if out.returncode == 0 and re.search(r"^SESSION ok ", out.stdout, re.M):
        return True
    if "MemoryError" in out.stdout + out.stderr:
        return False
    raise SystemExit("bench session failed (not a MemoryError): MICROPYPATH=%s %s\n%s%s"
                     % (env["MICROPYPATH"], " ".join(cmd), out.stdout, out.stderr))


def compiled_modules(exe, build):
    """lib/ and board/ compiled to .mpy for interpreter `exe` (its native arch, as `make deploy`
    compiles them for a board) under `build`; returns the two folders for MICROPYPATH."""
    if os.path.join(ROOT, "host", "tools") not in sys.path:
        sys.path.insert(0, os.path.join(ROOT, "host", "tools"))
    import deploy
    from board_link import ARCHS
    out = subprocess.run([exe, "-c", "import sys; print(sys.implementation._mpy)"], capture_output=True, text=True)
    arch = ARCHS.get((int(out.stdout) >> 10) & 0xF)
    lib = deploy.compile_lib(arch, build)
    deploy.compile_board(arch, build)
    return [str(lib.parent), str(lib.parent.parent / "board")]


def smallest_session_heap(exe, checkpoint, lo=8, hi=1024, above=tuple(range(1, 33)) + (48, 64, 96, 128, 256, 512),
                          mpy=False, data=None):
    """The smallest -X heapsize (KB) from which every larger size runs a fine-tune session
    (`import bench; bench.session(FLASH)`: Session on `checkpoint`, a one-epoch fit at the
    session's default batch on the checkpoint's training split, evaluate); data: the data file
    the checkpoint's metadata names (None: datasets/iris.csv, for the Iris checkpoint). Bisection between `lo` (must fail) and `hi` (must run), then every size in `above`
    KB over the result is verified; a failure there moves the answer above it and the check starts
    again (the smallest working heap is not a clean threshold: fragmentation). Returns (kb, sizes
    tried). mpy=False imports the .py sources (their compilation takes heap too); mpy=True the
    modules compiled to .mpy, as `make deploy` sends them to a board (the figure a board user
    sees). The first line printed says which."""
    flash = tempfile.mkdtemp(prefix="mf-bench-flash-")
    try:
        path = compiled_modules(exe, os.path.join(flash, "build")) if mpy else None
        print("  session heap of %s: %s" % (exe, "modules compiled to .mpy (as make deploy sends them)"
                                            if mpy else ".py sources (compiled at import)"), flush=True)
        os.makedirs(os.path.join(flash, "data"))
        shutil.copy(checkpoint, os.path.join(flash, "model.mfck"))
        data = data or os.path.join(ROOT, "datasets", "iris.csv")
        shutil.copy(data, os.path.join(flash, "data", os.path.basename(data)))
        tried = {}

        def runs(kb):
            if kb not in tried:
                tried[kb] = _session_runs(exe, flash, kb, path)
            return tried[kb]
        if runs(lo):
            raise SystemExit("bench: a fine-tune session already runs in %d KB; lower the bisection start" % lo)
        if not runs(hi):
            raise SystemExit("bench: a fine-tune session does not run in %d KB" % hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            ok = runs(mid)
            print("  session heap bisection: %d KB %s" % (mid, "runs" if ok else "fails"), flush=True)
            if ok:
                hi = mid
            else:
                lo = mid
        while True:
            print("  verifying %d larger sizes over %d KB ..." % (len(above), hi), flush=True)
            bad = [hi + d for d in above if not runs(hi + d)]
            if not bad:
                return hi, tried
            hi = max(bad) + 1
            while not runs(hi):
                hi += 1
    finally:
        shutil.rmtree(flash, ignore_errors=True)


def interpreters():
    """(name, path, word bits) of the interpreters to bench: stock, and the 32-bit port when it is built."""
    if not os.path.exists(STOCK):
        raise SystemExit("no MicroPython binary at %s (make setup)" % STOCK)
    out = [("stock 64-bit, double floats", STOCK, 64)]
    if os.path.exists(MP32):
        out.append(("32-bit, single floats (ESP32-like)", MP32, 32))
    else:
        print("bench: the 32-bit port is not built (%s): its rows are missing; `make mp32` builds it" % MP32)
    return out


def table(exe, heap, bits=64):
    rows = []
    print("microformer training step inside %s (%s heap); ms are wall time, fastest of 3 rounds"
          " (block/python: 1)" % (exe, heap))
    print("%-6s %-7s %9s %8s %8s %8s %9s %10s %10s %8s" % (
        "model", "backend", "ms/step", "fwd", "bwd", "opt", "us/sample", "alloc B", "peak B", "speedup"))
    for model in ("iris", "block"):
        # iris: the two backends alternate twice and each keeps its faster process, so a load
        # spike on this shared machine during one process does not set the ratio
        best = {}
        for _ in range(2 if model == "iris" else 1):
            for backend in ("python", "viper"):
                print("  measuring %s / %s ..." % (model, backend), flush=True)
                r = _run(exe, model, backend, heap)
                if backend not in best or r["ms"] < best[backend]["ms"]:
                    best[backend] = r
        for r in (best["python"], best["viper"]):
            rows.append(r)
            print("%-6s %-7s %9.3f %8.3f %8.3f %8.3f %9.1f %10s %10s %8s" % (
                r["model"], r["backend"], r["ms"], r["fwd"], r["bwd"], r["opt"], r["us_sample"],
                r["alloc"] if r["alloc"] >= 0 else ">heap", r["peak"] if bits == 64 else "n/a",
                "x%.1f" % (best["python"]["ms"] / r["ms"]) if r["backend"] == "viper" else ""), flush=True)
    print("alloc B: heap bytes one steady-state step allocates (gc.mem_alloc delta, GC off);"
          " peak B: micropython.mem_peak() of the whole run (allocated minus explicit frees, not a heap peak;"
          " n/a on a 32-bit port, where it wraps)")
    return rows


def cpython_table():
    """The same training steps under CPython: the NumPy backend (the host's default) against the
    portable loops, in one run."""
    print("== CPython %s (host): NumPy backend vs the portable loops" % sys.version.split()[0], flush=True)
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "lib"))
    print("%-6s %-7s %9s %8s %8s %8s %9s %8s" % ("model", "backend", "ms/step", "fwd", "bwd", "opt",
                                                 "us/sample", "speedup"))
    for model in ("iris", "block"):
        rows = {}
        for backend in ("python", "numpy"):
            cmd = [sys.executable, os.path.join(ROOT, "board", "benchmarks", "bench.py"), model, backend]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
            m = re.search(r"^RESULT (.*)$", out.stdout, re.M)
            if out.returncode or not m:
                raise SystemExit("bench failed: %s\n%s%s" % (" ".join(cmd), out.stdout, out.stderr))
            f = m.group(1).split()
            r = rows[backend] = {"ms": float(f[3]), "fwd": float(f[4]), "bwd": float(f[5]),
                                 "opt": float(f[6]), "us": float(f[9])}
            print("%-6s %-7s %9.3f %8.3f %8.3f %8.3f %9.1f %8s" % (
                model, backend, r["ms"], r["fwd"], r["bwd"], r["opt"], r["us"],
                "x%.1f" % (rows["python"]["ms"] / r["ms"]) if backend == "numpy" else ""), flush=True)


def numpy_vs_torch():
    """The NumPy backend's E=64 block step against PyTorch's, one thread each (host/bench/bench_numpy.py,
    in a process of its own: it pins the BLAS libraries to one thread before they load). Returns
    NumPy's time / PyTorch's, or what the script said instead of a figure (no torch)."""
    out = subprocess.run([sys.executable, os.path.join(ROOT, "host", "bench", "bench_numpy.py")], capture_output=True,
                         text=True, timeout=1800)
    if out.returncode:
        raise SystemExit("bench numpy vs torch failed:\n%s%s" % (out.stdout, out.stderr))
    print(out.stdout.strip(), flush=True)
    m = re.search(r"NumPy backend (\S+) ms, PyTorch (\S+) ms", out.stdout)
    return float(m.group(1)) / float(m.group(2)) if m else out.stdout.strip()


def callgrind_table(heap="64M"):
    """Instructions (callgrind) on each interpreter: per Iris training sample (a difference of two
    runs, so startup cancels) and per parameter of an optimizer step. A failed count is said."""
    for name, exe, _ in interpreters():
        print("callgrind, %s:" % name, flush=True)
        # (model, batch, backend, steps of the two runs); the portable block takes minutes a step
        for model, batch, backend, (s0, s1) in (("iris", 16, "viper", (5, 25)), ("iris", 16, "python", (1, 3)),
                                                ("block", 8, "viper", (1, 3))):
            a = _callgrind_ir(model, backend, s0, heap, exe)
            b = _callgrind_ir(model, backend, s1, heap, exe)
            if a and b:
                print("  %s %s: %.1fk instructions per training sample (batch %d)"
                      % (model, backend, (b - a) / ((s1 - s0) * batch) / 1000.0, batch), flush=True)
            else:
                print("  %s %s: callgrind gave no count" % (model, backend), flush=True)
        for kind in ("adam", "sgd"):
            ir = opt_instructions(kind, "viper", exe=exe)
            print("  optimizer %s (viper): %s instructions per parameter per opt.step() (the whole step: "
                  "update into the shadow with its checks, then the copy; Iris model)"
                  % (kind, "%.0f" % ir if ir else "no count"), flush=True)
    print("peer: " + PEER)
