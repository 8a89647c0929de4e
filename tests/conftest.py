"""pytest fixtures shared by every test file.

`micropython`: the path of a MicroPython interpreter; a test that takes it runs once per
interpreter: 'stock' (the 64-bit, double-precision unix port from requirements.txt) and 'mp32'
(the 32-bit, single-precision port built from source by `make mp32`: ESP32-like ints, floats and
object sizes; `MICROPYTHON32` overrides its path). Under CI (`CI=true`) both must be present: a
missing one fails the run instead of shrinking it.
"""
import os

import pytest

import helpers


def pytest_sessionstart(session):
    if os.environ.get("CI", "").lower() == "true":
        missing = [n for n in ("stock", "mp32") if not os.path.exists(helpers.interpreter_file(n))]
        if missing:
            pytest.exit("CI runs every MicroPython test on both interpreters; missing: %s (%s)" % (
                ", ".join(missing), ", ".join(helpers.interpreter_file(n) for n in missing)), returncode=3)


def pytest_report_header(config):
    return "MicroPython interpreters: " + ", ".join(
        "%s (%s)" % (n, helpers.interpreter_path(n)) for n in helpers.interpreters())


def pytest_generate_tests(metafunc):
    if "micropython" in metafunc.fixturenames:
        names = helpers.interpreters()
        metafunc.parametrize("micropython", [helpers.interpreter_path(n) for n in names], ids=names)
