"""host/native/check_elf.py, the check make native runs on every natmod object before linking:
initialised data and calls the module cannot link (libgcc helpers such as __divsf3, libm, memset)
are refused by name, a clean object passes; an .mpy header of another architecture or version is
refused by name."""
import importlib.util
import os
import shutil
import subprocess

import pytest

import helpers

spec = importlib.util.spec_from_file_location("check_elf", os.path.join(helpers.ROOT, "host", "native", "check_elf.py"))
check_elf = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_elf)

try:
    import elftools  # noqa: F401
except ImportError:
    if helpers.on_ci():
        raise
    pytest.skip("pyelftools is not installed (requirements.txt; make native installs it)", allow_module_level=True)


def _compile(tmp_path, name, source):
    if not shutil.which("gcc"):
        pytest.skip("no gcc on this machine")
    c = tmp_path / (name + ".c")
    c.write_text(source)
    o = tmp_path / (name + ".o")
    subprocess.run(["gcc", "-O2", "-fpic", "-fno-common", "-c", str(c), "-o", str(o)], check=True)
    return str(o)


def test_initialised_data_and_library_calls_are_refused(tmp_path):
    o = _compile(tmp_path, "bad", """
        #include <math.h>
        int table[4] = {1, 2, 3, 4};
        extern float mp_fun_table;
        __int128 quot(__int128 a, __int128 b) { return a / b; }      /* libgcc: __divti3 */
        float e(float x) { return expf(x) + table[1] + mp_fun_table; }   /* libm: expf */
    """)
    problems = check_elf.object_problems(o)
    assert any("section .data holds 16 bytes of initialised data" in p for p in problems), problems
    assert any("calls __divti3, a libgcc helper" in p for p in problems), problems
    assert any("calls expf, a library function" in p for p in problems), problems
    assert not any("calls mp_fun_table" in p for p in problems), problems
    assert check_elf.main([o]) == 1


def test_a_clean_object_passes(tmp_path):
    o = _compile(tmp_path, "good", """
        int counter;                       /* zeroed (BSS) is allowed */
        static const float k[2] = {0.5f, 2.0f};
        float f(float x, int i) { counter++; return x * k[i & 1]; }
    """)
    assert check_elf.object_problems(o) == []
    assert check_elf.main([o]) == 0


def test_mpy_header(tmp_path):
    f = tmp_path / "m.mpy"
    f.write_bytes(bytes([0x4D, 6, (10 << 2) | 3, 31]))          # xtensawin, .mpy 6.3
    assert check_elf.mpy_problems(str(f), "xtensawin") == []
    assert check_elf.mpy_problems(str(f), "x64") == ["%s: built for xtensawin, expected x64" % f]
    f.write_bytes(bytes([0x4D, 5, (2 << 2) | 0, 31]))
    assert check_elf.mpy_problems(str(f), "x64") == ["%s: .mpy version 5.0, expected 6.3" % f]
    f.write_bytes(b"PK\x03\x04")
    assert "not an .mpy file" in check_elf.mpy_problems(str(f), "x64")[0]


def test_xtensawin_module_builds_without_data_or_library_calls():
    # the ESP32-S3 build (make native NATIVE_ARCHS=xtensawin: GCC 13 with the core description): the
    # object has no initialised data and calls nothing but the firmware's table, the .mpy says xtensawin
    folder = helpers.native_module("xtensawin")
    mpy = os.path.join(folder, "mf_native.mpy")
    assert check_elf.object_problems(os.path.join(folder, "obj", "build-xtensawin", "mf_native.o")) == []
    assert check_elf.mpy_problems(mpy, "xtensawin") == []
    with open(mpy, "rb") as f:
        assert f.read(3) == bytes([0x4D, 0x06, 0x2B])


def test_deploy_native_names_the_build_it_needs():
    # make deploy NATIVE=1 for a board whose architecture has no build stops with the command to run
    import deploy
    with pytest.raises(SystemExit) as e:
        deploy.native_module("armv7emsp")
    assert "build/native/armv7emsp/mf_native.mpy is missing: build it with `make native NATIVE_ARCHS=armv7emsp`" \
        in str(e.value)
    with pytest.raises(SystemExit) as e:
        deploy.native_module(None)
    assert "runs no native code" in str(e.value)
