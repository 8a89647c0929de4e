"""Shared test helpers: paths, the script runners, numeric comparison.

The import path is set here, once, for the whole suite (conftest.py imports this module): lib/
(the package), board/, board/demos/ and board/benchmarks/ (what a board has in its root folder:
finetune, iris, bench, ...), host/tools/,
host/bench/, tests/ (these helpers and the CPython-side case tables), tests/oracles/ (the NumPy
reference) and tests/mp/ (the MicroPython-side scripts,
*_mp.py). Scripts run inside MicroPython or as a CPython subprocess get lib/, the three board
folders and tests/mp/ (MICROPYPATH / PYTHONPATH), the way a board has them: run one by hand with
    MICROPYPATH=lib:board:board/demos:board/benchmarks:tests/mp micropython tests/mp/<name>_mp.py [args]
"""
import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIB = os.path.join(ROOT, "lib")
BOARD = os.path.join(ROOT, "board")     # the session: finetune.py, mf_*.py
DEMOS = os.path.join(BOARD, "demos")     # the demos a board runs: iris, digits, charlm, sensor, seq2seq
BOARD_BENCH = os.path.join(BOARD, "benchmarks")  # the board's benchmarks and checks: bench, selftest, budget, ...
BOARD_PATH = [BOARD, DEMOS, BOARD_BENCH]  # all three land in a board's root folder (make deploy)
HOST = os.path.join(ROOT, "host")
TOOLS = os.path.join(HOST, "tools")      # what a user runs on the host (torch_io, deploy, vboard, ...)
BENCH = os.path.join(HOST, "bench")      # the benchmarks (bench_common: what they share)
VIPER_GEN = os.path.join(HOST, "viper")  # gen_viper.py and the viper templates it reads
TESTS = os.path.join(ROOT, "tests")
ORACLES = os.path.join(TESTS, "oracles")  # the NumPy reference and the files it writes
MP = os.path.join(TESTS, "mp")           # the MicroPython-side scripts (*_mp.py)
SCRIPT_PATH = [LIB] + BOARD_PATH + [MP, TESTS]    # what a script sees, in MicroPython or a CPython subprocess
IMPORT_PATH = [LIB] + BOARD_PATH + [TOOLS, BENCH, TESTS, ORACLES, MP]   # what the suite imports from (set once, here)
for _p in IMPORT_PATH:
    if _p not in sys.path:
        sys.path.insert(0, _p)


def interpreter_file(name):
    """Where interpreter `name` ('stock' or 'mp32') is expected (it may not exist)."""
    if name == "stock":
        return os.environ.get("MICROPYTHON") or os.path.join(os.path.dirname(sys.executable), "micropython")
    if name == "mp32":
        return os.environ.get("MICROPYTHON32") or MP32
    raise ValueError("interpreter must be 'stock' or 'mp32', got %r" % (name,))


def micropython_path():
    """The stock MicroPython unix port; a missing binary is a test failure, not a skip."""
    return interpreter_path("stock")


MP32 = os.path.join(ROOT, "build", "mp32", "micropython32-sp")


def interpreters():
    """The MicroPython interpreters the suite runs on: 'stock', and 'mp32' when it is built."""
    return ["stock", "mp32"] if os.path.exists(interpreter_file("mp32")) else ["stock"]


def interpreter_path(name):
    exe = interpreter_file(name)
    assert os.path.exists(exe), "%s MicroPython not found at %s: run `make %s`" % (
        name, exe, "setup" if name == "stock" else "mp32")
    return exe


def board_heap(exe=None, kb=512):
    """The -X heapsize standing for a board's `kb` KB heap on interpreter `exe` (None: the one the
    virtual board runs, the 32-bit port when built): kb on the 32-bit port, whose objects have a
    board's sizes; 1.25 kb on the stock 64-bit port, whose pointers and small objects take twice a
    board's bytes (a 512K test there measures the 64-bit object layout, not the board)."""
    exe = exe or interpreter_path(interpreters()[-1])
    return "%dK" % (kb * 5 // 4 if exe == micropython_path() else kb)


def on_ci():
    return os.environ.get("CI", "").lower() == "true"


def need_interpreter(name):
    """The path of interpreter `name`, for a test about that one port. The 32-bit port is optional
    on a developer's clone (`make mp32 MICROPYTHON_SRC=...` builds it): without it the test is
    skipped, saying why; under CI (`CI=true`) a missing port fails the test."""
    exe = interpreter_file(name)
    if not os.path.exists(exe) and name == "mp32" and not on_ci():
        import pytest
        pytest.skip("the 32-bit port is not built (%s): `make mp32 MICROPYTHON_SRC=...` builds it" % exe)
    return interpreter_path(name)


def make(*args, timeout=120, env=None):
    """Run `make ARGS` in the project folder (with the environment variables in `env` set; None
    unsets one) and return the CompletedProcess. The venv this suite runs in counts as installed
    (`-o .venv/.installed`): a test runs a target's own recipe, never `make setup`, which would
    reinstall the interpreter it is running on."""
    env = dict((k, v) for k, v in dict(os.environ, **(env or {})).items() if v is not None)
    env.pop("MAKEFLAGS", None)
    return subprocess.run(["make", "--no-print-directory", "-o", os.path.join(".venv", ".installed")] + list(args),
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


_TRAITS = {}


def traits(exe):
    """What interpreter `exe` is, asked of the interpreter itself: {'bits': 32 or 64 (the machine
    word, viper's int), 'float': 'single' or 'double'}."""
    if exe not in _TRAITS:
        out = subprocess.run([exe, "-c", "import sys, array\nprint(32 if sys.maxsize < 2**32 else 64, "
                              "'single' if array.array('f', [0.1])[0] == 0.1 else 'double')"],
                             capture_output=True, text=True, timeout=60, check=True).stdout.split()
        _TRAITS[exe] = {"bits": int(out[0]), "float": out[1]}
    return _TRAITS[exe]


def script(name):
    """The path of a script in tests/mp/ (a file that runs in MicroPython and CPython alike)."""
    path = os.path.join(MP, name)
    assert os.path.exists(path), path
    return path


def micropython_env():
    return dict(os.environ, MICROPYPATH=os.pathsep.join(SCRIPT_PATH))


def run_micropython(script, *args, heap="4M", timeout=600, cwd=None, exe=None):
    """Run a script under MicroPython (`exe`, default the stock port) with lib/, board/ and
    tests/ importable; return stdout (a non-zero exit, e.g. a failed assert, fails the test)."""
    proc = subprocess.run([exe or micropython_path(), "-X", "heapsize=" + heap, str(script)] + [str(a) for a in args],
                          capture_output=True, text=True, timeout=timeout, env=micropython_env(), cwd=cwd or ROOT)
    assert proc.returncode == 0, "micropython failed (rc=%d):\n%s\n%s" % (
        proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:])
    return proc.stdout


def run_cpython(script, *args, timeout=600, cwd=None):
    """The same script as a CPython subprocess with the same folders importable; return stdout."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(SCRIPT_PATH))
    proc = subprocess.run([sys.executable, str(script)] + [str(a) for a in args], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=cwd or ROOT)
    assert proc.returncode == 0, "python failed (rc=%d):\n%s\n%s" % (
        proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:])
    return proc.stdout


def run_cases_micropython(cases, tmp_path, backend="python", exe=None, heap="4M"):
    """The driver inside MicroPython on one backend: cases in, results out (JSON)."""
    src = tmp_path / ("cases-%s.json" % backend)
    dst = tmp_path / ("results-%s.json" % backend)
    src.write_text(json.dumps(cases))
    run_micropython(script("driver_mp.py"), str(src), str(dst), backend, heap=heap, exe=exe)
    results = json.loads(dst.read_text())
    assert len(results) == len(cases), "%d cases, %d results" % (len(cases), len(results))
    return results


def rel_err(got, want):
    """max |got - want| / max |want| (absolute when want is all ~0)."""
    got = np.asarray(got, dtype=np.float64).ravel()
    want = np.asarray(want, dtype=np.float64).ravel()
    assert got.shape == want.shape, (got.shape, want.shape)
    scale = max(float(np.abs(want).max()) if want.size else 0.0, 1e-6)
    return float(np.abs(got - want).max()) / scale if want.size else 0.0


def assert_close(got, want, tol, what=""):
    e = rel_err(got, want)
    assert e <= tol, "%s: relative error %.3g > %.3g" % (what, e, tol)


def f32(a):
    """Round to float32 (what lib stores), returned as float64 for the reference."""
    return np.asarray(a, dtype=np.float32).astype(np.float64)


def check_outputs(got, want, tol, what):
    """Compare every expected output; a mathematically zero one is judged at the case's scale.

    (dbk is exactly 0 in theory: softmax ignores a shift shared by all keys; with S=1 A is 1.
    float32 round-off there is compared with the case's largest value instead.)
    """
    assert set(want) <= set(got), "%s: missing outputs %s" % (what, set(want) - set(got))
    case_scale = max(float(np.abs(np.asarray(v)).max()) for v in want.values())
    for key, value in want.items():
        value = np.asarray(value, dtype=np.float64)
        if np.abs(value).max() <= 1e-9 * case_scale:
            err = float(np.abs(np.asarray(got[key], dtype=np.float64).ravel() - value.ravel()).max()) / case_scale
            assert err <= tol, "%s %s: should be 0, error %.3g of the case scale" % (what, key, err)
        else:
            assert_close(got[key], value, tol, "%s %s" % (what, key))


def user_module(folder, name, source):
    """(path, module): `source` written to folder/NAME.py and imported afresh, as a user's own
    model file (what `host/tools/torch_io.py --model FILE.py:FACTORY` imports)."""
    import importlib
    path = os.path.join(str(folder), name + ".py")
    with open(path, "w") as f:
        f.write(source)
    sys.path.insert(0, str(folder))
    try:
        sys.modules.pop(name, None)
        return path, importlib.import_module(name)
    finally:
        sys.path.remove(str(folder))


def native_module(arch):
    """build/native/<arch> holding mf_native.mpy built from host/native/mf_native.c as it is now
    (`make native NATIVE_ARCHS=arch`, one build at a time across pytest-xdist workers). Without
    MicroPython's source (../shared) the test is skipped saying so; under CI=true that fails it."""
    import fcntl
    import pytest
    folder = os.path.join(ROOT, "build", "native", arch)
    mpy = os.path.join(folder, "mf_native.mpy")
    src = os.path.join(ROOT, "host", "native", "mf_native.c")
    os.makedirs(os.path.dirname(folder), exist_ok=True)
    with open(os.path.join(os.path.dirname(folder), ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(mpy) or os.path.getmtime(mpy) < os.path.getmtime(src):
            r = make("native", "NATIVE_ARCHS=" + arch, timeout=900)
            if r.returncode:
                text = r.stdout + r.stderr
                if not on_ci() and ("needs MicroPython's source" in text or "xtensa_toolchain: needs" in text):
                    pytest.skip("the native module cannot be built here: " + text.strip().splitlines()[-1])
                pytest.fail("make native NATIVE_ARCHS=%s failed:\n%s" % (arch, text[-3000:]))
    return folder
