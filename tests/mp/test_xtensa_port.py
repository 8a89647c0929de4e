"""MicroPython on the emulated Xtensa core (host/xtensa, `make xtensa-port`): the host side's
helpers, and a small selection run on the emulator (marker `xtensa`: `make xtensa-test` runs them
before host/xtensa/xtest.py's checks; `make test` leaves them out). The emulator tests build the
port first when it is missing (about 4 minutes; one build for all workers) and skip, saying why,
when it cannot be built: no ../shared next to the project, or no Debian packages."""
import fcntl
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

import helpers

sys.path.insert(0, os.path.join(helpers.HOST, "xtensa"))
import run as xrun  # noqa: E402
import xtest  # noqa: E402

SHARED = os.path.join(os.path.dirname(helpers.ROOT), "shared")


# ---- the host side, no emulator ----

def f32bits(x):
    return struct.pack("<f", x).hex()


def test_max_ulps_counts_units_in_the_last_place():
    one, next_one = f32bits(1.0), struct.pack("<I", 0x3f800001).hex()
    assert xtest.max_ulps("KERNEL k " + one, "KERNEL k " + one) == 0
    assert xtest.max_ulps("KERNEL k " + one, "KERNEL k " + next_one) == 1
    # across zero: -0.0 and +0.0 are the same value; the smallest subnormals either side are 2 apart
    assert xtest.max_ulps("KERNEL k " + f32bits(-0.0), "KERNEL k " + f32bits(0.0)) == 0
    tiny, mtiny = struct.pack("<I", 1).hex(), struct.pack("<I", 0x80000001).hex()
    assert xtest.max_ulps("KERNEL k " + tiny, "KERNEL k " + mtiny) == 2
    # the worst element of several arrays; a shape difference is no comparison at all
    assert xtest.max_ulps("KERNEL k %s%s %s" % (one, one, one),
                          "KERNEL k %s%s %s" % (one, next_one, struct.pack("<I", 0x3f800003).hex())) == 3
    assert xtest.max_ulps("KERNEL k " + one, "KERNEL k " + one + one) is None
    assert xtest.max_abs("KERNEL k " + f32bits(1.0) + f32bits(2.0),
                         "KERNEL k " + f32bits(1.0) + f32bits(2.5)) == 0.5


def test_bundle_holds_each_file_under_its_path(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("print(1)\n")
    extra = tmp_path / "mod.mpy"
    extra.write_bytes(bytes(range(256)) * 3)
    files = xrun.bundle_files(str(script), lib=True, files=[str(extra) + ":/lib/mod.mpy"])
    path = tmp_path / "b.bin"
    xrun.write_bundle(str(path), files)
    raw = path.read_bytes()
    assert raw[:6] == b"MFXB1\n"
    got, i = {}, 6                      # the layout the firmware's boot code reads (host/xtensa/main.c)
    while i < len(raw):
        (k,) = struct.unpack_from("<H", raw, i)
        name = raw[i + 2:i + 2 + k].decode()
        (size,) = struct.unpack_from("<I", raw, i + 2 + k)
        got[name] = raw[i + 6 + k:i + 6 + k + size]
        i += 6 + k + size
    assert i == len(raw)
    assert got["/main.py"] == b"print(1)\n"
    assert got["/lib/mod.mpy"] == extra.read_bytes()
    lib = sorted(os.listdir(os.path.join(helpers.LIB, "microformer")))
    assert sorted(n.rsplit("/", 1)[1] for n in got if n.startswith("/lib/microformer/")) == \
        [n for n in lib if n.endswith(".py")]
    with pytest.raises(SystemExit, match="absolute"):
        xrun.write_bundle(str(path), [("rel.py", b"")])


def test_native_kernel_output_is_judged_as_test_native_judges_it():
    # xtest's native lines on the emulated core: every ERR line within the tolerance, DONE counting
    # them, exit status 0; anything else fails and names why
    good = "ERR zero/0 0.000e+00\nERR act_backward gelu_tanh/0 2.149e-06\nERR matmul_forward/0 3.0e-07\nDONE 3\n"
    ok, why = xtest.judge_native_kernels(0, good, 1e-5)
    assert ok and why.startswith("3 native-vs-portable comparisons") and "act_backward gelu_tanh/0" in why, why
    assert not xtest.judge_native_kernels(0, good.replace("2.149e-06", "2.0e-05"), 1e-5)[0]
    assert "act_backward gelu_tanh/0" in xtest.judge_native_kernels(0, good.replace("2.149e-06", "2.0e-05"), 1e-5)[1]
    assert not xtest.judge_native_kernels(0, good.replace("2.149e-06", "nan"), 1e-5)[0]
    assert not xtest.judge_native_kernels(0, good.replace("DONE 3", "DONE 4"), 1e-5)[0]   # a line lost
    assert not xtest.judge_native_kernels(0, good.replace("DONE 3\n", ""), 1e-5)[0]      # stopped early
    assert not xtest.judge_native_kernels(4, good, 1e-5)[0]                              # CPU exception
    assert not xtest.judge_native_kernels(0, "DONE 0\n", 1e-5)[0]                        # nothing compared


def test_native_selftest_output_needs_every_native_line_passing():
    line = "native  K              max err 5.79e-08  (tol 1e-04)  PASS"
    good = "\n".join([line] * 21 + ["viper   K   max err 1e-3 (tol 5e-03)  PASS", "SELFTEST True"])
    ok, why = xtest.judge_native_selftest(0, good)
    assert ok and why.startswith("21 golden checks"), why
    assert not xtest.judge_native_selftest(0, good.replace("PASS", "FAIL", 1))[0]
    assert not xtest.judge_native_selftest(0, good.replace("SELFTEST True", "SELFTEST False"))[0]
    assert not xtest.judge_native_selftest(1, good)[0]
    # the module not loaded: viper's lines only, no native backend checked
    assert not xtest.judge_native_selftest(0, "viper   K   max err 1e-3 (tol 5e-03)  PASS\nSELFTEST True")[0]


def test_native_instruction_rows_load_the_module_or_say_they_are_missing(tmp_path, monkeypatch, capsys):
    # host/xtensa/insns.py (make bench's Xtensa section): the native rows run with the board's
    # module in /lib (and the x86 module on the 32-bit port), beside viper's; without the module
    # they are said to be missing, never silently left out. Counts faked: 1000 + 7 per unit of work.
    import insns
    calls = []

    def fake(script, args, native=False, **kw):
        calls.append((args[1] if len(args) > 1 else args[0], native))
        work = int(args[3] if args[0] == "opt" else args[2])          # steps
        return 1000 + 7 * work * (16 if args[0] == "iris" else 8 if args[0] == "block" else 1), "OPT adam %s 475" % work

    monkeypatch.setattr(insns, "xtensa_count", fake)
    monkeypatch.setattr(insns, "NATIVE_XTENSA", tmp_path / "missing.mpy")
    res = insns.table(with_x86=False, only=("iris", "iris_native"))
    assert set(res) == {"iris"} and "native rows: not counted" in capsys.readouterr().out
    assert all(not native for _, native in calls)
    mod = tmp_path / "mf_native.mpy"
    mod.write_bytes(b"M")
    monkeypatch.setattr(insns, "NATIVE_XTENSA", mod)
    calls.clear()
    res = insns.measure(with_x86=False, only=("iris", "iris_native", "block_native", "adam_native"))
    assert set(res) == {"iris", "iris_native", "block_native", "adam_native"}
    assert res["iris_native"][0] == 7 and res["block_native"][0] == 7, res     # per sample
    assert res["adam_native"][0] == 7 * 10 / (10 * 475), res                   # per parameter
    assert {b for b, native in calls if native} == {"native"} and ("viper", False) in calls, calls


# ---- on the emulator ----

@pytest.fixture(scope="module")
def firmware(tmp_path_factory):
    if not os.path.isdir(SHARED):
        pytest.skip("the emulated Xtensa port cannot be built: %s (MicroPython and Xtensa sources) is missing" % SHARED)
    os.makedirs(os.path.join(helpers.ROOT, "build"), exist_ok=True)
    with open(os.path.join(helpers.ROOT, "build", ".xtensa-port.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)          # one build for all pytest-xdist workers
        r = subprocess.run(["make", "--no-print-directory", "xtensa-port"], cwd=helpers.ROOT,
                           capture_output=True, text=True, timeout=1800)
    if r.returncode:
        why = (r.stdout + r.stderr).strip().splitlines()[-3:]
        if os.environ.get("CI") == "true":
            pytest.fail("make xtensa-port failed: %s" % " / ".join(why))
        pytest.skip("make xtensa-port failed: %s" % " / ".join(why))
    return str(xrun.FIRMWARE)


def on_xtensa(script, args=(), **kw):
    status, out, _ = xrun.run(script, args, capture=True, timeout=600, **kw)
    return status, out


@pytest.mark.slow
@pytest.mark.xtensa
def test_viper_runs_as_xtensa_code(firmware, tmp_path):
    script = tmp_path / "v.py"
    script.write_text(
        "import micropython, sys, gc\n"
        "@micropython.viper\n"
        "def mul(a: int, b: int) -> int:\n"
        "    return a * b\n"
        "@micropython.viper\n"
        "def dot(a: ptr32, b: ptr32, n: int) -> int:\n"
        "    s = 0\n"
        "    for i in range(n):\n"
        "        s += a[i] * b[i]\n"
        "    return s\n"
        "from array import array\n"
        "x = array('i', range(1, 101))\n"
        "junk = [bytearray(1000) for _ in range(3000)]\n"
        "del junk\n"
        "gc.collect()\n"
        "print(sys.maxsize, mul(100000, 100000), dot(x, x, 100), sys.implementation._machine)\n"
        "try:\n"
        "    raise ValueError('out of viper')\n"
        "except ValueError as e:\n"
        "    print('caught', e)\n"
        "sys.exit(3)\n")
    status, out = on_xtensa(str(script))
    # 32-bit words that wrap mod 2**32 (10**10 mod 2**32), a viper loop over a buffer, the exception
    # machinery (windowed setjmp/longjmp), the garbage collector with native code on the heap
    assert out.splitlines()[0] == "2147483647 1410065408 %d qemu-xtensa-sim with de233_fpu" % sum(i * i for i in range(1, 101))
    assert out.splitlines()[1] == "caught out of viper"
    assert status == 3                      # sys.exit's status reaches the host


@pytest.mark.slow
@pytest.mark.xtensa
def test_float_division_is_ieee_single(firmware, tmp_path):
    # the port's own __divsf3 (host/xtensa/helpers.c) against NumPy's float32 division, bit for
    # bit: random bit patterns over the whole range, subnormals, powers of two, infinities
    rng = np.random.default_rng(5)
    a = rng.integers(0, 2 ** 32, 3000, dtype=np.uint64).astype(np.uint32)
    b = rng.integers(0, 2 ** 32, 3000, dtype=np.uint64).astype(np.uint32)
    special = np.array([0x00000001, 0x007fffff, 0x00800000, 0x3f800000, 0x7f7fffff, 0x7f800000,
                        0x80000003, 0x3effffff, 0x4b000001, 0x00400000], dtype=np.uint32)
    a = np.concatenate([a, np.repeat(special, len(special))])
    b = np.concatenate([b, np.tile(special, len(special))])
    fa, fb = a.view(np.float32), b.view(np.float32)
    keep = np.isfinite(fa) & np.isfinite(fb) & (fb != 0)   # MicroPython raises on x / 0
    pairs = np.empty(2 * keep.sum(), dtype=np.float32)
    pairs[0::2], pairs[1::2] = fa[keep], fb[keep]
    data = tmp_path / "pairs.hex"
    data.write_text(pairs.tobytes().hex())
    status, out = on_xtensa(os.path.join(helpers.MP, "xtensa_float_mp.py"), ["/pairs.hex"],
                            files=[str(data) + ":/pairs.hex"])
    assert status == 0, out
    got = np.frombuffer(bytes.fromhex(out.split("DIV ")[1].split()[0]), dtype=np.float32)
    with np.errstate(all="ignore"):
        want = fa[keep] / fb[keep]
    bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    assert len(got) == len(want) and len(bad) == 0, [(float(fa[keep][i]), float(fb[keep][i]), float(got[i]),
                                                      float(want[i])) for i in bad[:5]]


@pytest.mark.slow
@pytest.mark.xtensa
@pytest.mark.mp32
def test_a_viper_kernel_equals_the_32bit_port(firmware):
    if not os.path.exists(helpers.interpreter_file("mp32")):
        pytest.skip("the 32-bit port is not built (make mp32)")
    results = []
    xtest.check_kernels(results)
    by = {name: (ok, why) for name, ok, why in results}
    for module in ("viper_gemm", "viper_softmax", "viper_optim"):
        assert by["kernel " + module] == (True, "bit-identical to the 32-bit port"), by


@pytest.mark.slow
@pytest.mark.xtensa
def test_viper_code_needs_nothing_the_emulated_core_lacks(firmware, monkeypatch):
    # the board's viper machine code (mpy-cross -march=xtensawin, as make deploy builds it),
    # disassembled with the full ESP32-S3 core description: the emitter multiplies with mull only,
    # so nothing of mulsh/muluh/recip0.s, which QEMU's de233_fpu lacks
    import xtensa_cost
    so = os.path.join(helpers.ROOT, "build", "xtensa", "toolchain", "xtensa_esp32s3.so")
    monkeypatch.setenv("XTENSA_GNU_CONFIG", so)
    seen = {}
    for path in xtensa_cost.viper_modules():
        for code in xtensa_cost.viper_code(path).values():
            for ins in xtensa_cost.disassemble(code):
                seen[ins.mnem] = seen.get(ins.mnem, 0) + 1
    assert seen.get("mull", 0) > 0 and seen.get("entry", 0) > 0      # the disassembly names them
    assert not {"mulsh", "muluh", "recip0.s"} & set(seen), seen


@pytest.mark.slow
@pytest.mark.xtensa
@pytest.mark.mp32
def test_native_module_runs_on_the_emulated_core(firmware):
    # the C kernels' module a board gets (build/native/xtensawin/mf_native.mpy) on the emulated
    # core: the same object as a build for the emulated core's description, every kernel against
    # the portable one, the golden selftest on native, an Iris fit on native (2 seeds, 100 epochs)
    # within one test sample of the x86 module's on the 32-bit port
    if not os.path.exists(helpers.interpreter_file("mp32")):
        if os.environ.get("CI") == "true":
            pytest.fail("the 32-bit port is not built (make mp32)")
        pytest.skip("the 32-bit port is not built (make mp32)")
    helpers.native_module("xtensawin")
    helpers.native_module("x86")
    results = []
    xtest.check_native(results, epochs=100, seeds=(1, 2))
    by = {name: (ok, why) for name, ok, why in results}
    assert set(by) == {"native build", "native chosen", "native kernels", "native selftest", "native iris"}, by
    assert all(ok for ok, _ in by.values()), by
    assert "byte for byte the board's" in by["native build"][1], by
    assert int(by["native kernels"][1].split()[0]) >= 100, by
