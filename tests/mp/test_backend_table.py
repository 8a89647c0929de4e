"""The kernel table inside MicroPython (tests/mp/kernel_table_mp.py): every backend the port runs
(python and viper; native where mf_native.mpy is built) holds every kernel the table names, the
viper modules loaded on first use included; the table is let go once the backend is chosen; and a viper module that lacks a kernel its table
column names is refused when it loads, naming the kernel and the backend, whether it loads with
the package (an error at `import microformer`) or on first use (an error at that first use)."""
import os
import re
import shutil
import subprocess

import pytest

import helpers
from microformer import kernel_table

N = len(kernel_table.rows())


def test_every_backend_holds_every_kernel(micropython):
    out = helpers.run_micropython(helpers.script("kernel_table_mp.py"), exe=micropython)
    lines = [l for l in out.splitlines() if l.startswith("TABLE ")]
    assert "TABLE python %d True" % N in lines and "TABLE viper %d True" % N in lines, out
    # the table's text (about 3 KB) is not kept once the backend is chosen
    assert "KEPT False False" in out.splitlines(), out


def test_every_backend_holds_every_kernel_cpython():
    out = helpers.run_cpython(helpers.script("kernel_table_mp.py"))
    assert "TABLE python %d True" % N in out and "TABLE numpy %d True" % N in out, out
    assert "KEPT True True" in out.splitlines(), out          # CPython keeps it (nothing to save)


def _lib_without(tmp_path, module, name):
    # a copy of lib/ whose viper_<module>.py no longer binds the kernel `name`
    lib = tmp_path / "lib"
    shutil.copytree(helpers.LIB, str(lib), ignore=shutil.ignore_patterns("__pycache__"))
    p = lib / "microformer" / ("viper_%s.py" % module)
    text = p.read_text()
    cut = re.sub(r"(?m)^%s = \w+\n" % name, "", text)
    if cut == text:
        cut = re.sub(r"(?m)^def %s\(" % name, "def _gone_%s(" % name, text)
    assert cut != text
    p.write_text(cut)
    return lib


_FIRST_USE = """
import microformer as mf
print("BACKEND", mf.get_backend())
try:
    mf.backend.K.gather_rows
except ValueError as e:
    print("REFUSED", type(e).__name__, e)
"""


@pytest.mark.parametrize("module, name, at", [("elementwise", "copy", "import"), ("rows", "argmax", "first use")])
def test_a_viper_module_without_a_kernel_is_refused_when_it_loads(tmp_path, micropython, module, name, at):
    lib = _lib_without(tmp_path, module, name)
    script = tmp_path / "s.py"
    script.write_text(_FIRST_USE)
    proc = subprocess.run([micropython, "-X", "heapsize=4M", str(script)], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, MICROPYPATH=str(lib)), cwd=str(tmp_path))
    text = proc.stdout + proc.stderr
    want = "the viper backend (microformer.viper_%s) lacks the kernel %s(" % (module, name)
    if at == "import":
        assert proc.returncode != 0 and "KernelTableError" in text and want in text, text
    else:
        assert proc.returncode == 0 and "BACKEND viper" in text, text
        assert "REFUSED KernelTableError kernel table: " + want in text, text
