"""The suite's own rules: the lint gate fails on an undefined name, `make test` and `make
test-fast` lint before pytest and run it on workers, the markers select what `make test-fast`
leaves out, and every test leaves the microformer backend as it found it."""
import os
import re
import shutil
import subprocess
import sys

import helpers


def _pytest(tmp_path, source, *args, name="probe_test.py"):
    """Run pytest in a subprocess on one file written to tmp_path, with tests/conftest.py as a
    plugin (its hooks and fixtures, as for a file in tests/); any file stands in for the 32-bit
    port, so the `micropython` fixture has both legs."""
    (tmp_path / name).write_text(source)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([helpers.TESTS] + sys.path), MICROPYTHON32=sys.executable)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider",
                           "-p", "no:xdist", name] + list(args), cwd=str(tmp_path), env=env,
                          capture_output=True, text=True, timeout=120)


def test_lint_fails_on_an_undefined_name_and_skips_generated_files(tmp_path):
    shutil.copy(os.path.join(helpers.ROOT, "ruff.toml"), str(tmp_path))
    (tmp_path / "good.py").write_text("import os\n\n\ndef f():\n    return os.sep\n")
    (tmp_path / "lib" / "microformer").mkdir(parents=True)
    (tmp_path / "lib" / "microformer" / "viper_made.py").write_text("def f():\n    return made_up\n")
    lint = [sys.executable, "-m", "ruff", "check", "."]        # what `make lint` runs
    r = subprocess.run(lint, cwd=str(tmp_path), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr           # a generated file is not linted
    (tmp_path / "bad.py").write_text("def f():\n    return undefined_thing\n")
    r = subprocess.run(lint, cwd=str(tmp_path), capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "F821" in r.stdout and "`undefined_thing`" in r.stdout and "bad.py" in r.stdout, r.stdout
    assert "viper_made.py" not in r.stdout, r.stdout


def _recipe(target):
    # CI unset: the recipe's first line holds $(MAKE), so `make -n` runs it, and under CI=true it
    # refuses a run without the 32-bit leg (test_mp32_build checks that)
    r = helpers.make("-n", target, "MICROPYTHON_SRC=", "MP32=/nonexistent/mp32", env={"JOBS": None, "CI": None})
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_make_test_lints_then_runs_pytest_on_workers_and_says_how_long():
    for target, selection in (("test", ' -m "not xtensa" tests;'),
                              ("test-fast", ' -m "not board and not mp32 and not slow" tests;')):
        out = _recipe(target)
        lint = out.index("-m ruff check .")
        run = re.search(r"-m pytest -q -n auto" + re.escape(selection), out)
        assert run and lint < run.start(), out
        assert "make %s: pytest took" % target in out, out


def test_markers_select_the_board_and_the_32_bit_port(tmp_path):
    source = ("import vboard\n\n\ndef test_in_a_board_file():\n    pass\n\n\n"
              "def test_each_interpreter(micropython):\n    pass\n")
    listed = _pytest(tmp_path, source, "--co").stdout
    assert "test_in_a_board_file" in listed and "test_each_interpreter[mp32]" in listed, listed
    r = _pytest(tmp_path, source, "--co", "-m", "not board and not mp32")
    assert "probe_test.py::" not in r.stdout and "3 deselected" in r.stdout, r.stdout + r.stderr
    r = _pytest(tmp_path, source.replace("import vboard\n", "import json\n"), "--co", "-m", "not board and not mp32")
    assert "probe_test.py::test_in_a_board_file" in r.stdout and "test_each_interpreter[stock]" in r.stdout, r.stdout
    assert "[mp32]" not in r.stdout and "1 deselected" in r.stdout, r.stdout


def test_every_test_leaves_the_backend_as_it_found_it(tmp_path):
    source = ("import microformer as mf\n\n\ndef test_switches():\n    mf.set_backend('python')\n\n\n"
              "def test_after():\n    assert mf.get_backend() == 'numpy', mf.get_backend()\n")
    r = _pytest(tmp_path, source)
    assert r.returncode == 0 and "2 passed" in r.stdout, r.stdout + r.stderr


def test_slow_tests_are_marked_and_a_stale_name_is_refused(tmp_path):
    import conftest
    file, name = conftest.SLOW[0].split("::")
    source = "def %s():\n    pass\n\n\ndef test_quick():\n    pass\n" % name
    r = _pytest(tmp_path, source, "--co", "-m", "not slow", name=file)
    assert "::test_quick" in r.stdout and "1 deselected" in r.stdout, r.stdout + r.stderr
    r = _pytest(tmp_path, source.replace(name, "test_renamed"), "--co", name=file)
    assert r.returncode != 0 and "SLOW names tests that do not exist: " + conftest.SLOW[0] in r.stderr, r.stdout + r.stderr


def test_a_test_in_the_wrong_folder_is_refused():
    import conftest
    t = helpers.TESTS
    ok = [("unit/test_a.py", (), False), ("mp/test_a.py", ("micropython",), False),
          ("board/test_a.py", ("micropython",), True)]
    for rel, fixtures, board in ok:
        assert conftest.folder_problem(os.path.join(t, rel), "test_x", fixtures, board) is None, rel
    assert conftest.folder_problem("/elsewhere/probe_test.py", "test_x", ("micropython",), True) is None
    flat = conftest.folder_problem(os.path.join(t, "test_a.py"), "test_x", (), False)
    assert flat.startswith("tests/test_a.py: a test file goes in tests/unit, tests/mp or tests/board"), flat
    mp = conftest.folder_problem(os.path.join(t, "unit", "test_a.py"), "test_x", ("micropython",), False)
    assert mp == "tests/unit/test_a.py: test_x takes the micropython fixture: it belongs in tests/mp", mp
    board = conftest.folder_problem(os.path.join(t, "mp", "test_a.py"), "test_x", (), True)
    assert board == "tests/mp/test_a.py: test_x runs the virtual board: it belongs in tests/board", board


def test_each_xdist_worker_deploys_from_its_own_folder(tmp_path):
    source = ("import os, time, pytest\nimport deploy\n\n\n@pytest.mark.parametrize('i', range(4))\n"
              "def test_where(i):\n    time.sleep(0.5)\n    with open(os.path.join(%r, 'w%%d' %% i), 'w') as f:\n"
              "        f.write('%%s %%s' %% (os.environ.get('PYTEST_XDIST_WORKER'), deploy.BUILD))\n" % str(tmp_path))
    (tmp_path / "probe_test.py").write_text(source)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([helpers.TESTS] + sys.path))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider", "-n", "2",
                        "probe_test.py"], cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    seen = dict(p.read_text().split(" ", 1) for p in tmp_path.glob("w*"))
    default = os.path.join(helpers.ROOT, "build", "deploy")
    assert sorted(seen) == ["gw0", "gw1"] and len(set(seen.values())) == 2, seen
    assert default not in seen.values(), seen


def test_every_test_has_a_time_limit(tmp_path):
    import conftest
    slow_file, slow_name = conftest.SLOW[0].split("::")
    source = ("import time\n\nimport pytest\n\n\n"
              "def test_default(request):\n    assert request.node.get_closest_marker('timeout').args == (%d,)\n\n\n"
              "def %s(request):\n    assert request.node.get_closest_marker('timeout').args == (%d,)\n\n\n"
              "@pytest.mark.timeout(2)\ndef test_hangs():\n    time.sleep(30)\n"
              % (conftest.TIMEOUT, slow_name, conftest.LONG_TIMEOUT))
    r = _pytest(tmp_path, source, name=slow_file)
    assert "1 failed, 2 passed" in r.stdout and "Timeout (>2.0s)" in r.stdout, r.stdout + r.stderr
    assert conftest.TIMEOUT >= 300 and conftest.LONG_TIMEOUT >= 3 * 140    # the longest take ~140 s
