"""pytest fixtures shared by every test file.

`micropython`: the path of a MicroPython interpreter; a test that takes it runs once per
interpreter: 'stock' (the 64-bit, double-precision unix port from requirements.txt) and 'mp32'
(the 32-bit, single-precision port built from source by the Makefile: ESP32-like ints, floats
and object sizes).
"""
import os

import pytest

import helpers


def pytest_generate_tests(metafunc):
    if "micropython" in metafunc.fixturenames:
        names = helpers.interpreters()
        metafunc.parametrize("micropython", [helpers.interpreter_path(n) for n in names], ids=names)
