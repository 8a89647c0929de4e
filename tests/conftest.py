"""pytest fixtures shared by every test file (importing helpers sets the import path once).

`pretrained_iris`: (path, stdout) of the Iris checkpoint host/tools/pretrain.py writes (100 epochs, as
`make pretrain`), made once per test run (pytest-xdist's workers share it). `iris_flash(folder)`:
a folder holding what `make deploy` puts on a board's flash: model.mfck (that checkpoint) and
data/iris.csv (the base data its metadata names).

`micropython`: the path of a MicroPython interpreter; a test that takes it runs once per
interpreter: 'stock' (the 64-bit, double-precision unix port from requirements.txt) and 'mp32'
(the 32-bit, single-precision port built from source by `make mp32`: ESP32-like ints, floats and
object sizes; `MICROPYTHON32` overrides its path). Under CI (`CI=true`) both must be present: a
missing one fails the run instead of shrinking it.

Markers, set here at collection (`make test-fast` is `pytest -m "not board and not mp32 and not
slow"`): `board` for every test that runs the virtual board (its file or its body uses
host/tools/vboard.py), `mp32` for every test
that runs the 32-bit port (the 'mp32' leg of `micropython`, or marked by hand), `slow` for the
tests named in SLOW. Every test leaves the microformer backend as it found it (`_restore_backend`).
A test file sits in the folder of what it runs (tests/unit, tests/mp, tests/board: FOLDERS);
collection refuses one that does not (folder_problem).
"""
import inspect
import os
import re
import shutil
import subprocess
import sys

import pytest

import helpers


def pytest_sessionstart(session):
    if helpers.on_ci() and not session.config.pluginmanager.hasplugin("timeout"):
        pytest.exit("CI runs every test with a time limit: pytest-timeout is missing (make setup installs "
                    "requirements.txt)", returncode=3)
    if helpers.on_ci():
        missing = [n for n in ("stock", "mp32") if not os.path.exists(helpers.interpreter_file(n))]
        if missing:
            pytest.exit("CI runs every MicroPython test on both interpreters; missing: %s (%s)" % (
                ", ".join(missing), ", ".join(helpers.interpreter_file(n) for n in missing)), returncode=3)


MARKERS = {
    "board": "runs the virtual board (host/tools/vboard.py): a MicroPython process behind a pty, mpremote",
    "mp32": "runs the 32-bit single-precision port (build/mp32, `make mp32`)",
    "slow": "takes 20 s or more by itself (a whole training run, a sweep); listed in SLOW",
    "xtensa": "runs on the emulated Xtensa core (host/xtensa): `make xtensa-test` runs these after "
              "building the port, `make test` leaves them out",
}
# Tests that take 20 s or more each (measured on 2 busy cores with --durations): whole training
# runs inside MicroPython, sweeps, torch statistics. `make test-fast` leaves them out.
SLOW = (
    "test_iris.py::test_iris_cpython_and_micropython_match_the_seed",
    "test_longseq.py::test_s512_fits_where_the_standard_path_cannot",
    "test_sensor.py::test_same_predictions_in_micropython_and_fine_tune",
    "test_viper.py::test_iris_viper_matches_portable_accuracy",
    "test_native.py::test_iris_fit_matches_portable",
    "test_fit_heap.py::test_switch_interrupted_anywhere",
    "test_family_demos.py::test_demos_micropython",
    "test_family_plots.py::test_plots_write_pngs",
    "test_checkpoint.py::test_killed_micropython_mid_save",
    "test_torch_io.py::test_cli_to_checkpoint_loads_in_micropython",
    "test_torch_io.py::test_cli_refuses_to_overwrite_and_asks_for_the_architecture",
    "test_decoder_dropout.py::test_torch_train_statistics",
    "test_torch_fx_models.py::test_cli_both_ways",
    "test_torch_fx_refusals.py::test_out_in_a_missing_folder_or_naming_a_folder",
    "test_torch_fx_refusals.py::test_the_way_back_without_the_module_says_to_name_it",
    "test_torch_io_models.py::test_cli_minimal_meta_then_back_into_the_users_module",
    "test_doc_figures.py::test_quality_page_is_what_a_run_gives",
    "test_session_start.py::test_session_runs_in_the_heap_the_bench_reports",
)


# A time limit per test (pytest-timeout, requirements.txt): a test that hangs, or allocates without
# end, is stopped and reported as failed instead of holding a worker for the rest of the run. The
# longest tests of a full run take about 140 s alone on 2 busy cores (the Ctrl-C storm on the
# 32-bit port; four deploys to one virtual board about 120 s); SLOW and LONG get LONG_TIMEOUT. A test's own @pytest.mark.timeout(s) wins.
TIMEOUT = 300
LONG_TIMEOUT = 900
LONG = (
    "test_trust_board.py::test_ctrl_c_storm_during_fit",
    "test_trust_board.py::test_ctrl_c_while_the_handler_comes_and_goes_never_kills_the_board",
    "test_deploy_user_files.py::test_a_manifest_deploy_cannot_read_counts_as_absent",
)


def time_limit(name):
    """The per-test limit, in seconds, for a test named 'file.py::test'."""
    return LONG_TIMEOUT if name in SLOW or name in LONG else TIMEOUT


def pytest_configure(config):
    for name, what in MARKERS.items():
        config.addinivalue_line("markers", "%s: %s" % (name, what))


VBOARD_USE = re.compile(r"^\s*import vboard\b|\bvboard\.\w", re.M)


def uses_vboard(item):
    """A test runs the virtual board when its module imports host/tools/vboard.py or its body does."""
    if getattr(getattr(item, "module", None), "vboard", None) is not None:
        return True
    try:
        return bool(VBOARD_USE.search(inspect.getsource(item.function)))
    except (AttributeError, OSError, TypeError):
        return False


FOLDERS = {
    "unit": "CPython only",
    "mp": "runs MicroPython-side scripts (tests/mp/*_mp.py) on the ports",
    "board": "runs the virtual board",
}


def folder_problem(path, test, fixtures, board):
    """What is wrong with where test `test` of file `path` sits (tests/README.md, Layout), or
    None: a file of this suite goes in the folder of what it runs. Files outside tests/ (a
    probe file a test writes elsewhere) are not judged."""
    rel = os.path.relpath(path, helpers.TESTS)
    if rel.startswith(".."):
        return None
    folder = os.path.dirname(rel)
    where = "tests/" + rel
    if folder not in FOLDERS:
        return "%s: a test file goes in tests/unit, tests/mp or tests/board (%s)" % (
            where, "; ".join("%s: %s" % kv for kv in FOLDERS.items()))
    if folder == "unit" and "micropython" in fixtures:
        return "%s: %s takes the micropython fixture: it belongs in tests/mp" % (where, test)
    if folder != "board" and board:
        return "%s: %s runs the virtual board: it belongs in tests/board" % (where, test)
    return None


def pytest_collection_modifyitems(config, items):
    names = set()
    misplaced = []
    timed = config.pluginmanager.hasplugin("timeout")
    for item in items:
        name = "%s::%s" % (os.path.basename(str(item.fspath)), getattr(item, "originalname", item.name))
        names.add(name)
        if name in SLOW:
            item.add_marker(pytest.mark.slow)
        if uses_vboard(item):
            item.add_marker(pytest.mark.board)
        if timed and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(time_limit(name)))
        problem = folder_problem(str(item.fspath), item.name, getattr(item, "fixturenames", ()),
                                 item.get_closest_marker("board") is not None)
        if problem and problem not in misplaced:
            misplaced.append(problem)
    if misplaced:
        raise pytest.UsageError("tests in the wrong folder:\n  " + "\n  ".join(misplaced))
    files = set(n.split("::")[0] for n in names)
    for what, listed in (("SLOW", SLOW), ("LONG", LONG)):
        stale = [n for n in listed if n.split("::")[0] in files and n not in names]
        if stale:
            raise pytest.UsageError("tests/conftest.py %s names tests that do not exist: %s" % (what, ", ".join(stale)))


def pytest_report_header(config):
    return "MicroPython interpreters: " + ", ".join(
        "%s (%s)" % (n, helpers.interpreter_path(n)) for n in helpers.interpreters())


def pytest_generate_tests(metafunc):
    if "micropython" in metafunc.fixturenames:
        names = helpers.interpreters()
        metafunc.parametrize("micropython", [
            pytest.param(helpers.interpreter_path(n), id=n, marks=[pytest.mark.mp32] if n == "mp32" else [])
            for n in names])


@pytest.fixture(scope="session", autouse=True)
def _deploys_per_worker(tmp_path_factory):
    """Under pytest-xdist each worker compiles what it deploys into a folder of its own: host/tools/deploy.py
    empties and refills build/deploy/<arch>/ on every deploy, so two workers deploying at once
    would copy files from under each other (a board then misses modules). The same for a test that
    runs `make deploy` (MF_DEPLOY_BUILD)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    import deploy
    patch = pytest.MonkeyPatch()
    folder = tmp_path_factory.mktemp("deploy")
    patch.setattr(deploy, "BUILD", folder)
    patch.setenv("MF_DEPLOY_BUILD", str(folder))     # and `make deploy` run by a test
    yield
    patch.undo()


@pytest.fixture(autouse=True)
def _restore_backend():
    """Every test leaves the kernels as it found them: a test that selects 'python' (or 'viper')
    and never switches back would otherwise run every later test in this process on it."""
    import microformer as mf
    before = mf.get_backend()
    why = mf.backend.why
    yield
    if mf.get_backend() != before or mf.backend.why != why:
        mf.set_backend(before, why)


@pytest.fixture(scope="session")
def pretrained_iris(tmp_path_factory):
    # under pytest-xdist the workers share one pretraining: the first makes it (under a lock) in
    # the folder above their own temporary folders, the others read it
    import fcntl
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent
    folder = shared / "pretrain-iris"
    folder.mkdir(exist_ok=True)
    out, log = folder / "iris.mfck", folder / "stdout.txt"
    with open(str(folder / "lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not log.exists():
            proc = subprocess.run([sys.executable, os.path.join(helpers.TOOLS, "pretrain.py"),
                                   "--data", os.path.join(helpers.ROOT, "datasets", "iris.csv"),
                                   "--epochs", "100", "--out", str(out)],
                                  capture_output=True, text=True, timeout=600, cwd=helpers.ROOT)
            assert proc.returncode == 0, proc.stdout + proc.stderr
            log.write_text(proc.stdout)                     # written last: the checkpoint is complete
    return str(out), log.read_text()


@pytest.fixture
def iris_flash(pretrained_iris):
    def make(folder):
        os.makedirs(os.path.join(str(folder), "data"))
        shutil.copy(pretrained_iris[0], os.path.join(str(folder), "model.mfck"))
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


@pytest.fixture(scope="session")
def deployed_flash(tmp_path_factory, pretrained_iris):
    """flash(folder, micropython): fill folder/flash (a VirtualBoard(folder)'s flash) with what a
    first `make deploy` of the pretrained Iris checkpoint wrote to a board run by `micropython`
    (modules compiled for its architecture, the manifest, /model.mfck, /data/iris.csv). A test
    whose subject is not the first deploy starts from there: its own deploy.deploy() then finds
    the board current and copies only what differs (its checkpoint, its data), as a redeploy does.
    Copying ~600 KB through mpremote takes about 35 s a board; this deploy runs once per
    interpreter and test run (shared by the xdist workers, like pretrained_iris). First deploys
    stay tested where they are the subject (test_deploy_*.py, test_board_e2e.py)."""
    import fcntl
    import vboard
    import deploy
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent

    def flash(folder, micropython):
        name = os.path.basename(micropython)
        made = shared / ("deployed-" + name)
        made.mkdir(exist_ok=True)
        template = made / "flash"
        with open(str(made / "lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (made / "done").exists():
                shutil.rmtree(str(made / "board"), ignore_errors=True)
                with vboard.VirtualBoard(made / "board", heap=helpers.board_heap(micropython),
                                         micropython=micropython) as b:
                    deploy.deploy(b.port, pretrained_iris[0], say=lambda s: None)
                shutil.rmtree(str(template), ignore_errors=True)
                shutil.copytree(str(b.flash), str(template))
                (made / "done").write_text(micropython)     # written last: the copy is complete
        dst = os.path.join(str(folder), "flash")
        shutil.copytree(str(template), dst)
        return dst
    return flash
