"""The backend is chosen explicitly and says why (microformer.backend.why): the default names the
interpreter, set_backend names its caller, and an interpreter without the fast backend runs the
portable one saying what ruled the fast one out (CPython without NumPy here); set_backend refuses
a backend the interpreter cannot run and changes nothing. A finetune session's first line names
the backend and why, inside MicroPython."""
import pytest

import helpers

_PROBE = (
    "import sys\n"
    "%s"
    "import microformer as mf\n"
    "from microformer import backend\n"
    "print('WHY', mf.get_backend(), '|', backend.why)\n"
    "try:\n"
    "    mf.set_backend(%r)\n"
    "except ValueError as e:\n"
    "    print('REFUSED', e)\n"
    "print('NOW', mf.get_backend(), '|', backend.why)\n"
    "mf.set_backend('python')\n"
    "print('SET', mf.get_backend(), '|', backend.why)\n")


def _lines(out):
    return dict(l.split(" ", 1) for l in out.splitlines() if l.split(" ", 1)[0] in ("WHY", "REFUSED", "NOW", "SET"))


def test_cpython_default_and_set(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(_PROBE % ("", "viper"))
    got = _lines(helpers.run_cpython(str(script)))
    assert got["WHY"] == "numpy | the default on CPython"
    assert "'viper' needs MicroPython" in got["REFUSED"]
    assert got["NOW"] == got["WHY"], "a refused set_backend changed the backend"
    assert got["SET"] == "python | chosen with set_backend('python')"


def test_cpython_without_numpy_says_so(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(_PROBE % ("sys.modules['numpy'] = None\n", "numpy"))
    got = _lines(helpers.run_cpython(str(script)))
    name, why = got["WHY"].split(" | ")
    assert name == "python"
    assert why.startswith("the default on CPython without the numpy backend: ") and "NumPy" in why, why
    assert "'numpy' needs CPython with NumPy" in got["REFUSED"]


def test_micropython_default(tmp_path, micropython):
    script = tmp_path / "probe.py"
    script.write_text(_PROBE % ("", "numpy"))
    got = _lines(helpers.run_micropython(str(script), exe=micropython))
    # without mf_native.mpy on the path: viper, and why not the C kernels
    assert got["WHY"].startswith("viper | the default on MicroPython; not native: no mf_native.mpy on sys.path"), got
    assert got["NOW"] == got["WHY"]


@pytest.mark.parametrize("chosen", [None, "python"])
def test_session_first_line_says_why(tmp_path, micropython, chosen):
    flash = tmp_path / "flash"
    flash.mkdir()
    script = tmp_path / "session.py"
    script.write_text(
        "import sys\nimport trust_data_mp\n"
        "finetune = trust_data_mp.make_flash(%r)\n"
        "finetune.Session(root=%r, backend=%r)\n" % (str(flash), str(flash), chosen))
    out = helpers.run_micropython(str(script), exe=micropython, heap="2M")
    want = "backend viper (the default on MicroPython; not native: no mf_native.mpy" if chosen is None else \
        "backend python (chosen with set_backend('python'))"
    first = [l for l in out.splitlines() if "examples; backend" in l]
    assert first and want in first[0], out
