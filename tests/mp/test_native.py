"""The native backend: the C kernels of host/native/mf_native.c as a MicroPython natmod, built by
`make native` for x64 (the stock port) and x86 (the 32-bit port) and run inside each port:
every kernel against the portable kernel of the same name (within 1e-5 relative), the layers,
models and optimizers against the NumPy reference (tests/oracles/reference.py, through the driver's cases),
the golden vectors (board/benchmarks/selftest.py), an Iris fit, the backend switch and its reasons, and the
errors of bad arguments. The module is built when missing or older than its source; without
MicroPython's source (../shared) the tests skip saying so, and under CI=true they fail instead."""
import json
import os
import re
import shutil
import statistics
import subprocess

import pytest

import family_cases
import helpers
import layer_cases
import test_optim_model

ROOT = helpers.ROOT
SRC = os.path.join(ROOT, "host", "native", "mf_native.c")
TOL_PORTABLE = 1e-5     # native against the portable kernels (the bound for float32 kernels)
TOL_REFERENCE = 1e-4    # against the float64 NumPy reference: the portable backend's tolerance


def arch_of(exe):
    return "x64" if helpers.traits(exe)["bits"] == 64 else "x86"


def native_dir(arch):
    """build/native/<arch>, holding mf_native.mpy built from the current source (`make native`)."""
    return helpers.native_module(arch)


@pytest.fixture
def native(micropython):
    """(interpreter, folder of its mf_native.mpy)."""
    return micropython, native_dir(arch_of(micropython))


def run(exe, folder, script, *args, heap="8M", timeout=600, cwd=None):
    env = dict(os.environ, MICROPYPATH=os.pathsep.join(helpers.SCRIPT_PATH + [folder]))
    p = subprocess.run([exe, "-X", "heapsize=" + heap, str(script)] + [str(a) for a in args], capture_output=True,
                       text=True, timeout=timeout, env=env, cwd=cwd or ROOT)
    assert p.returncode == 0, "micropython failed (rc=%d):\n%s\n%s" % (p.returncode, p.stdout[-3000:], p.stderr[-3000:])
    return p.stdout


def kernel_table():
    """NATIVE and PORTABLE of lib/microformer/kernels_native.py (it imports only inside
    MicroPython): the kernel table's native column, 'C' and '-'."""
    from microformer import kernel_table as T
    return tuple(T.kernels("native", "C")), tuple(T.kernels("native", "-"))


def test_every_kernel_is_native_or_listed_portable():
    # the backend has every kernel of kernels.py: in C, or portable by the table, never both
    from microformer import kernels
    public = {n for n, v in vars(kernels).items() if callable(v) and not n.startswith("_")
              and getattr(v, "__module__", "") == kernels.__name__}
    nat, port = kernel_table()
    assert not set(nat) & set(port), set(nat) & set(port)
    assert set(nat) | set(port) == public, (public - set(nat) - set(port), set(nat) | set(port) - public)


def test_kernels_match_the_portable_ones(native):
    exe, folder = native
    out = run(exe, folder, helpers.script("native_kernels_mp.py"))
    lines = [ln for ln in out.splitlines() if ln.startswith("ERR ")]
    done = re.search(r"^DONE (\d+)$", out, re.M)
    assert done and int(done.group(1)) == len(lines), out[-2000:]
    worst = {}
    for ln in lines:
        name, value = ln[4:].rsplit(" ", 1)
        worst[name] = float(value)
    bad = {k: v for k, v in worst.items() if not v <= TOL_PORTABLE}
    assert not bad, bad
    nat, _ = kernel_table()
    tried = {name.split(" ")[0].split("/")[0] for name in worst}
    tried |= {"sgd_step", "adam_step"} & {n.split("_step")[0] + "_step" for n in tried}
    assert set(nat) <= tried, set(nat) - tried


def test_scalar_code_of_xtensawin_matches_the_portable_kernels():
    # the code paths only the ESP32-S3 build runs (no SSE: four scalar partial sums, the integer
    # square root, division by Newton-Raphson), built for x64 (x64-scalar) and run on the stock port
    exe = helpers.micropython_path()
    out = run(exe, native_dir("x64-scalar"), helpers.script("native_kernels_mp.py"))
    lines = [ln for ln in out.splitlines() if ln.startswith("ERR ")]
    assert re.search(r"^DONE %d$" % len(lines), out, re.M), out[-2000:]
    bad = {ln[4:].rsplit(" ", 1)[0]: float(ln.rsplit(" ", 1)[1]) for ln in lines
           if not float(ln.rsplit(" ", 1)[1]) <= TOL_PORTABLE}
    assert not bad, bad


def _cases_on_native(exe, folder, cases, tmp_path):
    src, dst = tmp_path / "cases.json", tmp_path / "results.json"
    src.write_text(json.dumps(cases))
    run(exe, folder, helpers.script("driver_mp.py"), src, dst, "native")
    results = json.loads(dst.read_text())
    assert len(results) == len(cases)
    return results


def test_layers_against_the_reference(native, tmp_path):
    exe, folder = native
    cases = layer_cases.all_cases() + family_cases.all_cases()
    results = _cases_on_native(exe, folder, [c[1] for c in cases], tmp_path)
    for (name, _, want), got in zip(cases, results, strict=True):
        helpers.check_outputs(got, want, TOL_REFERENCE, "native " + name)


def test_optimizers_and_model_against_the_reference(native, tmp_path):
    exe, folder = native
    cases, wants = [], []
    for kind, kwargs in test_optim_model.OPTIMS:
        c, w, n = test_optim_model._optim_case(kind, kwargs)
        cases.append(c)
        wants.append((kind, w, n))
    c, w = test_optim_model._iris_model_case()
    results = _cases_on_native(exe, folder, cases + [c], tmp_path)
    for got, (kind, w_, n) in zip(results, wants):
        test_optim_model._check_optim(got, w_, n, "native " + kind, TOL_REFERENCE)
    test_optim_model._check_model(results[-1], w, "native Iris model", TOL_REFERENCE)


def test_golden_vectors(native):
    exe, folder = native
    probe = "import selftest\nassert selftest.run()\n"
    out = subprocess.run([exe, "-X", "heapsize=8M", "-c", probe], capture_output=True, text=True, timeout=600,
                         cwd=ROOT, env=dict(os.environ, MICROPYPATH=os.pathsep.join(
                             [os.path.join(ROOT, "lib")] + helpers.BOARD_PATH + [folder])))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("native ")]
    assert len(lines) >= 20 and all(ln.endswith("PASS") for ln in lines), out.stdout


def _iris(exe, folder, runs, epochs):
    # {(seed, backend): (train accuracy, test accuracy)} of board/demos/iris.py's fit
    probe = ("import iris\n"
             "for seed, b in %r:\n"
             "    r = iris.main(epochs=%d, backend=b, seed=seed, verbose=False)\n"
             "    print('IRIS', seed, b, r['train_acc'], r['test_acc'])\n" % (tuple(runs), epochs))
    p = subprocess.run([exe, "-X", "heapsize=8M", "-c", probe], capture_output=True, text=True, timeout=900,
                       cwd=ROOT, env=dict(os.environ, MICROPYPATH=os.pathsep.join(
                           [os.path.join(ROOT, "lib")] + helpers.BOARD_PATH + [folder])))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    acc = {}
    for ln in p.stdout.splitlines():
        if ln.startswith("IRIS "):
            _, seed, b, tr, te = ln.split()
            acc[(int(seed), b)] = (float(tr), float(te))
    assert len(acc) == len(runs), p.stdout
    return acc


def test_iris_fit(native):
    # the seed's Iris model trained from scratch on the C kernels (100 epochs, as board/demos/iris.py),
    # five seeds: every run learns the task (the seed's C++: 99.17 % train / 93.33 % test), and the
    # figures host/native/README.md gives are these
    exe, folder = native
    acc = _iris(exe, folder, [(s, "native") for s in (1, 2, 3, 4, 5)], 100)
    for key, (tr, te) in acc.items():
        assert tr >= 0.9 and te >= 0.85, acc
    tests = [te for tr, te in acc.values()]
    doc = open(os.path.join(ROOT, "host", "native", "README.md")).read()
    m = re.search(r"train accuracy (\d+) % every seed, test accuracy (\d\.\d\d) ± (\d\.\d\d)", doc)
    assert m, "host/native/README.md no longer states the Iris figures"
    assert all(round(100 * tr) == int(m.group(1)) for tr, te in acc.values()), (acc, m.group(0))
    assert ("%.2f" % statistics.mean(tests), "%.2f" % statistics.stdev(tests)) == (m.group(2), m.group(3)), \
        (acc, m.group(0))


def test_iris_fit_matches_portable(native):
    # the same seed on the portable kernels: the test accuracy within one sample of the 30
    exe, folder = native
    acc = _iris(exe, folder, [(1, "native"), (1, "python")], 40)
    assert abs(acc[(1, "native")][1] - acc[(1, "python")][1]) <= 1.0 / 30 + 1e-9, acc


_PROBE = """
import microformer as mf
from microformer import backend
print('WHY', mf.get_backend(), '|', backend.why)
try:
    mf.set_backend('native')
    print('SET', mf.get_backend())
except ValueError as e:
    print('REFUSED', e)
"""


def _probe(exe, folder, tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(_PROBE)
    out = run(exe, folder, script)
    return dict(ln.split(" ", 1) for ln in out.splitlines() if ln.split(" ", 1)[0] in ("WHY", "SET", "REFUSED"))


def test_chosen_when_present_and_said(native, tmp_path):
    exe, folder = native
    got = _probe(exe, folder, tmp_path)
    arch = arch_of(exe)
    assert got["WHY"].startswith("native | the default on MicroPython: "), got
    assert got["WHY"].endswith("mf_native.mpy (%s)" % arch), got
    assert got["SET"] == "native", got


def test_other_architecture_refused_by_name(native, tmp_path):
    # the other port's module under the same name: viper runs, and both say which architecture is which
    exe, _ = native
    arch = arch_of(exe)
    other = "x86" if arch == "x64" else "x64"
    folder = tmp_path / "lib"
    folder.mkdir()
    shutil.copy(os.path.join(native_dir(other), "mf_native.mpy"), folder / "mf_native.mpy")
    got = _probe(exe, str(folder), tmp_path)
    want = "mf_native.mpy is built for %s, this MicroPython runs %s native code" % (other, arch)
    assert got["WHY"].startswith("viper | the default on MicroPython; not native: "), got
    assert want in got["WHY"], got
    assert want in got["REFUSED"], got
    # a file that is no .mpy at all, and one of this architecture but another .mpy version
    (folder / "mf_native.mpy").write_bytes(b"not a module")
    assert "is not an .mpy file" in _probe(exe, str(folder), tmp_path)["REFUSED"]
    code = {"x64": 2, "x86": 1}[arch]
    (folder / "mf_native.mpy").write_bytes(bytes([0x4D, 5, (code << 2) | 0, 31]) + b"\0" * 16)
    assert "mf_native.mpy is .mpy 5.0, this MicroPython loads .mpy 6.3" in _probe(exe, str(folder), tmp_path)["REFUSED"]


def test_bad_arguments_name_the_kernel_and_the_argument(native, tmp_path):
    exe, folder = native
    script = tmp_path / "bad.py"
    script.write_text("""
from array import array
from microformer import kernels_native as K
def show(f):
    try:
        f()
        print('ACCEPTED')
    except (ValueError, TypeError) as e:
        print('%s: %s' % (type(e).__name__, e))
a = array('f', [0.0] * 6)
show(lambda: K.matmul_forward(a, a, array('f', [0.0] * 5), None, 2, 3, 2))
show(lambda: K.matmul_forward(a, a, bytearray(24), None, 2, 3, 2))
show(lambda: K.matmul_forward(a, a, a, None, 2, 3))
show(lambda: K.zero(a, -1))
show(lambda: K.crossentropy_softmax(a, a, [0, 3], 2, 3))
show(lambda: K.act_forward(a, a, 6, 99))
show(lambda: K.attention_forward(a, a, a, a, a, None, 1, 1, 1, 6, 4, 0))
show(lambda: K.attention_forward(a, a, a, a, a, array('f', [0.0]), 1, 1, 1, 6, 2, 0))
""")
    out = run(exe, folder, script).splitlines()
    assert out == [
        "ValueError: matmul_forward: weight holds 5 values, the sizes need 6",
        "ValueError: matmul_forward: weight must be a float32 buffer (array('f')) of at least 6 values",
        "TypeError: matmul_forward takes 7 arguments, got 6",
        "ValueError: zero: size n must be >= 0, got -1",
        "ValueError: crossentropy_softmax: labels must be ints in [0, 3), got 3",
        "ValueError: act_forward: unknown activation kind 99",
        "ValueError: attention_forward: C=6 must be a multiple of NH, got NH=4",
        "ACCEPTED",
    ], out


def test_native_module_objects_have_no_data_and_no_library_calls(native):
    # the objects make native linked, checked again here (host/native/check_elf.py)
    import importlib.util
    if importlib.util.find_spec("elftools") is None and not helpers.on_ci():
        pytest.skip("pyelftools is not installed (requirements.txt; make native installs it)")
    spec = importlib.util.spec_from_file_location("check_elf", os.path.join(ROOT, "host", "native", "check_elf.py"))
    check_elf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check_elf)
    exe, folder = native
    arch = arch_of(exe)
    obj = os.path.join(folder, "obj", "build-" + arch, "mf_native.o")
    assert check_elf.object_problems(obj) == []
    assert check_elf.mpy_problems(os.path.join(folder, "mf_native.mpy"), arch) == []
