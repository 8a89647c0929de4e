"""pytest fixtures shared by every test file (importing helpers sets the import path once).

`pretrained_iris`: (path, stdout) of the Iris checkpoint host/pretrain.py writes (100 epochs, as
`make pretrain`), made once per test session. `iris_flash(folder)`: a folder holding what `make
deploy` puts on a board's flash: iris.mfck (that checkpoint) and data/iris.csv.

`micropython`: the path of a MicroPython interpreter; a test that takes it runs once per
interpreter: 'stock' (the 64-bit, double-precision unix port from requirements.txt) and 'mp32'
(the 32-bit, single-precision port built from source by `make mp32`: ESP32-like ints, floats and
object sizes; `MICROPYTHON32` overrides its path). Under CI (`CI=true`) both must be present: a
missing one fails the run instead of shrinking it.

Markers (`pytest -m "not board and not mp32"` is `make test-fast`), set here at collection:
`board` for every test that runs the virtual board (its file or its body uses host/vboard.py; under
pytest-xdist they all run on one worker, in turn),
`mp32` for every test that runs the 32-bit port (the 'mp32' leg of `micropython`, or marked by
hand). Every test leaves the microformer backend as it found it (`_restore_backend`).
"""
import inspect
import os
import shutil
import subprocess
import sys

import pytest

import helpers


def pytest_sessionstart(session):
    if helpers.on_ci():
        missing = [n for n in ("stock", "mp32") if not os.path.exists(helpers.interpreter_file(n))]
        if missing:
            pytest.exit("CI runs every MicroPython test on both interpreters; missing: %s (%s)" % (
                ", ".join(missing), ", ".join(helpers.interpreter_file(n) for n in missing)), returncode=3)


MARKERS = {
    "board": "runs the virtual board (host/vboard.py): a MicroPython process behind a pty, mpremote",
    "mp32": "runs the 32-bit single-precision port (build/mp32, `make mp32`)",
}


def pytest_configure(config):
    for name, what in MARKERS.items():
        config.addinivalue_line("markers", "%s: %s" % (name, what))


def uses_vboard(item):
    """A test runs the virtual board when its module imports host/vboard.py or its body does."""
    if getattr(getattr(item, "module", None), "vboard", None) is not None:
        return True
    try:
        return "vboard" in inspect.getsource(item.function)
    except (AttributeError, OSError, TypeError):
        return False


def pytest_collection_modifyitems(config, items):
    grouped = config.pluginmanager.hasplugin("xdist")
    for item in items:
        if uses_vboard(item):
            item.add_marker(pytest.mark.board)
        if grouped and item.get_closest_marker("board"):
            # one worker runs the board tests in turn (`make test` runs pytest with --dist loadgroup):
            # every deploy compiles into the same build/deploy/ folder
            item.add_marker(pytest.mark.xdist_group("board"))


def pytest_report_header(config):
    return "MicroPython interpreters: " + ", ".join(
        "%s (%s)" % (n, helpers.interpreter_path(n)) for n in helpers.interpreters())


def pytest_generate_tests(metafunc):
    if "micropython" in metafunc.fixturenames:
        names = helpers.interpreters()
        metafunc.parametrize("micropython", [
            pytest.param(helpers.interpreter_path(n), id=n, marks=[pytest.mark.mp32] if n == "mp32" else [])
            for n in names])


@pytest.fixture(autouse=True)
def _restore_backend():
    """Every test leaves the kernels as it found them: a test that selects 'python' (or 'viper')
    and never switches back would otherwise run every later test in this process on it."""
    import microformer as mf
    before = mf.get_backend()
    yield
    if mf.get_backend() != before:
        mf.set_backend(before)


@pytest.fixture(scope="session")
def pretrained_iris(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("pretrain") / "iris.mfck")
    proc = subprocess.run([sys.executable, os.path.join(helpers.HOST, "pretrain.py"),
                           "--data", os.path.join(helpers.ROOT, "datasets", "iris.csv"),
                           "--epochs", "100", "--out", out],
                          capture_output=True, text=True, timeout=600, cwd=helpers.ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out, proc.stdout


@pytest.fixture
def iris_flash(pretrained_iris):
    def make(folder):
        os.makedirs(os.path.join(str(folder), "data"))
        shutil.copy(pretrained_iris[0], os.path.join(str(folder), "iris.mfck"))
        shutil.copy(os.path.join(helpers.ROOT, "datasets", "iris.csv"),
                    os.path.join(str(folder), "data", "iris.csv"))
        return str(folder)
    return make


@pytest.fixture(params=["python", "numpy"])
def backend(request):
    """A CPython test that takes `backend` runs once per host backend: 'python' (the portable
    loops the board runs without viper) and 'numpy' (the host default, restored afterwards)."""
    import microformer as mf
    mf.set_backend(request.param)
    yield request.param
    mf.set_backend("numpy")


@pytest.fixture(scope="session")
def iris_checkpoint(pretrained_iris):
    """pathlib.Path of the session's pretrained Iris checkpoint (read it, never change it)."""
    import pathlib
    return pathlib.Path(pretrained_iris[0])
