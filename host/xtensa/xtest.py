#!/usr/bin/env python3
"""make xtensa-test: the board's checks as Xtensa machine code on the emulated core.

    python host/xtensa/xtest.py [--epochs N] [--only NAME ...]

Runs on build/xtensa/firmware.elf (make xtensa-port), each as a script through run.py:
  selftest  board/benchmarks/selftest.py with tests/golden/*.mfg (make selftest's checks), every line PASS
  kernels   host/xtensa/kernels_mp.py: a viper kernel or more from each lib/microformer/viper_*.py;
            each module's output bits equal the 32-bit unix port's (build/mp32/micropython32-sp)
  viper_tests  tests/mp/test_viper.py's kernel scripts (viper against the portable kernels on
            random, adversarial, worst-case and special inputs), judged as that file does
  iris      board/demos/iris.py trained on viper from seeds 1, 2, 3 (--epochs, default 40): test
            accuracy mean +- std, and each seed's loss and accuracies equal to the 32-bit port's
  decode    host/xtensa/decode_mp.py: prefill + 12 decode steps, tokens and logits equal to the
            32-bit port's
  natmod    MicroPython's examples/natmod/features0 built for xtensawin (C, the port's toolchain),
            imported from /lib and called
  native    the C kernels' module a board gets (build/native/xtensawin/mf_native.mpy, make native):
            the same object as a build for the emulated core's description; picked by default
            (backend.why names it); every kernel against the portable one
            (tests/mp/native_kernels_mp.py); the golden selftest on native; Iris
            on native from seeds 1-5 (100 epochs), compared with the x86 module on the 32-bit port
Prints one line per check and `N passed, M failed`; exit status 1 when any failed. A missing
32-bit port is a failure of the comparisons (they cannot be made), never a skip.
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
import run as xrun  # noqa: E402

MP32 = ROOT / "build" / "mp32" / "micropython32-sp"
GOLDEN = ["tests/golden/%s.mfg:/golden/%s.mfg" % (n, n) for n in ("attention", "decoder", "conv1d")]


def on_xtensa(script, args=(), files=(), timeout=900):
    status, out, _ = xrun.run(str(script), args, lib=True, board=True,
                              files=[str(ROOT / f.split(":")[0]) + ":" + f.split(":")[1] for f in files],
                              timeout=timeout, capture=True)
    return status, out


def on_mp32(script, args=(), path="lib:board:board/demos:board/benchmarks", timeout=600):
    if not MP32.is_file():
        return None, "the 32-bit unix port %s is missing (make mp32)" % MP32
    env = dict(os.environ, MICROPYPATH=":".join(str(ROOT / p) for p in path.split(":")))
    p = subprocess.run([str(MP32), "-X", "heapsize=8M", str(script)] + list(args), cwd=str(ROOT),
                       env=env, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def lines(out, prefix):
    return [ln for ln in out.splitlines() if ln.startswith(prefix)]


def check_selftest(results):
    script = HERE / "selftest_mp.py"
    status, out = on_xtensa(script, files=GOLDEN)
    fails = [ln for ln in out.splitlines() if ln.rstrip().endswith("FAIL")]
    summary = (lines(out, "selftest:") or ["no summary"])[0]
    ok = status == 0 and "SELFTEST True" in out and not fails
    results.append(("selftest", ok, summary + ("" if ok else "; " + "; ".join(fails or [out[-300:]]))))


def max_ulps(a, b):
    """The largest difference in units in the last place between two KERNEL lines of float32 hex
    arrays (None when their shapes differ)."""
    xa, xb = a.split()[2:], b.split()[2:]
    if len(xa) != len(xb) or any(len(p) != len(q) for p, q in zip(xa, xb)):
        return None

    def ordered(w):  # float32 bits as an integer that is monotonic in the float's value
        return w if w < 0x80000000 else 0x80000000 - w

    worst = 0
    for p, q in zip(xa, xb):
        bp, bq = bytes.fromhex(p), bytes.fromhex(q)
        for i in range(0, len(bp), 4):
            wp = int.from_bytes(bp[i:i + 4], "little")
            wq = int.from_bytes(bq[i:i + 4], "little")
            worst = max(worst, abs(ordered(wp) - ordered(wq)))
    return worst


def max_abs(a, b):
    """The largest absolute difference between two KERNEL lines of float32 hex arrays."""
    import struct
    xa, xb = a.split()[2:], b.split()[2:]
    if len(xa) != len(xb) or any(len(p) != len(q) for p, q in zip(xa, xb)):
        return None
    worst = 0.0
    for p, q in zip(xa, xb):
        n = len(p) // 8
        for u, v in zip(struct.unpack("<%df" % n, bytes.fromhex(p)), struct.unpack("<%df" % n, bytes.fromhex(q))):
            worst = max(worst, abs(u - v))
    return worst


def check_kernels(results):
    script = HERE / "kernels_mp.py"
    status, out = on_xtensa(script)
    ref_status, ref = on_mp32(script)
    mine = {ln.split()[1]: ln for ln in lines(out, "KERNEL ")}
    theirs = {ln.split()[1]: ln for ln in lines(ref, "KERNEL ")} if ref_status == 0 else {}
    if not mine:
        results.append(("kernels", False, "no KERNEL lines from the emulated core: " + out[-300:]))
        return
    for name in sorted(mine):
        line = mine[name]
        if " ERROR " in line:
            results.append(("kernel " + name, False, line[:200]))
        elif ref_status != 0:
            results.append(("kernel " + name, False, "not compared: " + ref[-200:].strip()))
        elif name == "libm_gelu_tanh_table":
            d = max_abs(line, theirs.get(name, ""))
            results.append(("kernel " + name, d is not None and d <= 1e-6,
                            "viper GELU_TANH with its table from libm's tanh: at most %.1e from the "
                            "32-bit port's" % (d if d is not None else float("nan"))))
        elif name.startswith("libm"):
            u = max_ulps(line, theirs.get(name, ""))
            results.append(("kernel " + name, u is not None and u <= 2,
                            "portable (libm): at most %s ulp from the 32-bit port (glibc's libm there, "
                            "MicroPython's lib/libm here)" % u))
        else:
            same = theirs.get(name) == line
            results.append(("kernel " + name, same, "bit-identical to the 32-bit port" if same
                            else "DIFFERS from the 32-bit port"))


def check_iris(results, epochs, seeds=(1, 2, 3)):
    """Iris trained on viper from each seed: test accuracy mean +- std over the seeds, and every
    seed's loss and accuracies equal to the same run on the 32-bit port."""
    script = HERE / "iris_mp.py"
    args = [str(epochs), ":".join(str(s) for s in seeds)]
    status, out = on_xtensa(script, args, files=["datasets/iris.csv:/data/iris.csv"])
    got = [json.loads(ln) for ln in lines(out, "{")]
    if status != 0 or len(got) != len(seeds):
        results.append(("iris", False, "no result: " + out[-300:]))
        return
    acc = [r["test_acc"] for r in got]
    mean = sum(acc) / len(acc)
    std = (sum((a - mean) ** 2 for a in acc) / (len(acc) - 1)) ** 0.5 if len(acc) > 1 else 0.0
    detail = ("viper, %d epochs, seeds %s: test accuracy %.1f +- %.1f %% (mean +- std), final loss %s, "
              "%.2f s/epoch in QEMU" % (epochs, ",".join(map(str, seeds)), 100 * mean, 100 * std,
                                         " ".join("%.4f" % r["final_loss"] for r in got), got[0]["s_per_epoch"]))
    ref_status, ref = on_mp32(script, args)
    if ref_status != 0:
        results.append(("iris", False, detail + "; not compared: " + ref[-200:].strip()))
        return
    theirs = [json.loads(ln) for ln in lines(ref, "{")]
    same = len(theirs) == len(got) and all(r[k] == q[k] for r, q in zip(got, theirs)
                                           for k in ("final_loss", "train_acc", "test_acc"))
    results.append(("iris", same, detail + ("; each seed equal to the 32-bit port's run" if same else
                                            "; DIFFERS from the 32-bit port's %s" % theirs)))


def check_decode(results):
    script = HERE / "decode_mp.py"
    status, out = on_xtensa(script)
    mine = lines(out, "DECODE ")
    if status != 0 or len(mine) != 2:
        results.append(("decode", False, "no result: " + out[-300:]))
        return
    ref_status, ref = on_mp32(script)
    if ref_status != 0:
        results.append(("decode", False, "not compared: " + ref[-200:].strip()))
        return
    same = lines(ref, "DECODE ") == mine
    results.append(("decode", same, mine[0] + ("; tokens and logits equal to the 32-bit port's" if same
                                               else "; DIFFERS from the 32-bit port's")))


def natmod_build(src_dir, out_dir):
    """Build the dynamic native module in src_dir (a MicroPython examples/natmod folder) for
    xtensawin with the port's toolchain, in a copy under out_dir; return (the .mpy path or None,
    the build's output)."""
    import shutil
    tc = ROOT / "build" / "xtensa" / "toolchain"
    work = Path(out_dir) / Path(src_dir).name
    shutil.copytree(src_dir, work)
    env = dict(os.environ, XTENSA_GNU_CONFIG=str(tc / "xtensa_esp32s3_qemu.so"),
               PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    r = subprocess.run(["make", "MPY_DIR=" + str(ROOT / "build" / "xtensa" / "mp"), "ARCH=xtensawin",
                        "CROSS=xtensa-lx106-elf-", "CC=" + str(tc / "bin" / "xtensa-gcc"),
                        "CFLAGS_EXTRA=-mabi=windowed -mlongcalls -isystem /usr/lib/xtensa-lx106-elf/include"],
                       cwd=str(work), env=env, capture_output=True, text=True, timeout=300)
    mpy = sorted(work.glob("*.mpy"))
    return (str(mpy[0]) if r.returncode == 0 and mpy else None), r.stdout + r.stderr


def check_natmod(results):
    """A dynamic native module (MicroPython's examples/natmod/features0, C compiled for xtensawin)
    imported from the file system and called."""
    import tempfile
    src = ROOT / "build" / "xtensa" / "mp" / "examples" / "natmod" / "features0"
    with tempfile.TemporaryDirectory() as d:
        mpy, log = natmod_build(src, d)
        if not mpy:
            results.append(("natmod", False, "building features0.mpy failed: " + log[-300:]))
            return
        script = Path(d) / "nat.py"
        script.write_text("import features0\nprint('NATMOD', features0.factorial(12))\n")
        status, out, _ = xrun.run(str(script), files=[mpy + ":/lib/features0.mpy"], capture=True, timeout=120)
    ok = status == 0 and "NATMOD 479001600" in out
    results.append(("natmod", ok, "features0.mpy (xtensawin) imported from /lib: factorial(12) = 479001600"
                    if ok else out[-300:]))


def check_viper_tests(results):
    """tests/mp/test_viper.py's kernel scripts on the emulated core, judged as that file judges
    them on the unix ports: every viper kernel against the portable kernel on random (seed 12345),
    adversarial and worst-case (overflow bound) inputs within its tolerance, and the special
    values (+-inf, NaN) giving no NaN and no hang."""
    import re
    import tempfile
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "mp")]
    import test_viper as T
    with tempfile.TemporaryDirectory() as d:
        for name, body, seed in (("random", T.RANDOM, 12345), ("adversarial", T.ADVERSARIAL, 4242),
                                 ("worst", T.WORST, 12345)):
            script = Path(d) / ("viper_%s.py" % name)
            script.write_text(T._script(body, seed))
            status, out, _ = xrun.run(str(script), lib=True, heap=16 * 1024 * 1024, capture=True, timeout=900)
            errs = T._errors(out)
            bad = {k: v for k, v in errs.items() if not (v <= T.TOL)}
            ok = status == 0 and ("DONE" in out or "DONE" not in body) and bool(errs) and not bad
            results.append(("test_viper " + name, ok, "%d viper-vs-portable comparisons, worst %.1e (tolerance %g)"
                            % (len(errs), max(errs.values()) if errs else float("nan"), T.TOL)
                            + ("" if ok else "; beyond: %r %s" % (bad, out[-200:] if status else ""))))
        script = Path(d) / "viper_special.py"
        script.write_text("import microformer.kernels_viper as KV\nimport sys\nsys.modules['KV'] = KV\n" + T.SPECIAL)
        status, out, _ = xrun.run(str(script), lib=True, heap=16 * 1024 * 1024, capture=True, timeout=300)
        nans = [ln for ln in out.splitlines() if re.match(r"SPECIAL (.*) nan=(\d+)$", ln) and not ln.endswith("nan=0")]
        ok = status == 0 and "DONE" in out and not nans and "SPECIAL xent loss nan" in out \
            and "ACT 0 nan=2" in out and "ACT 1 nan=2" in out
        results.append(("test_viper special", ok, "+-inf and NaN inputs: finite or +-inf outputs, no NaN"
                        if ok else "; ".join(nans) or out[-300:]))


NATIVE = ROOT / "build" / "native"
NATIVE_MPY = NATIVE / "xtensawin" / "mf_native.mpy"
NATIVE_FILE = str(NATIVE_MPY) + ":/lib/mf_native.mpy"


def native_same_for_emulator():
    """(same, detail): host/native/mf_native.c compiled against the emulated core's description
    (the ESP32-S3's without mulsh/muluh/recip0.s, build/xtensa/toolchain) gives the very object file
    the board's module was linked from (build/native/xtensawin/obj, the full ESP32-S3 description):
    then the file a board gets is the file the emulator runs, and no instruction the emulated core
    lacks is in it."""
    import filecmp
    import tempfile
    board_o = NATIVE / "xtensawin" / "obj" / "build-xtensawin" / "mf_native.o"
    emu_cfg = ROOT / "build" / "xtensa" / "toolchain" / "xtensa_esp32s3_qemu.so"
    cross = NATIVE / "xtensa-toolchain" / "bin" / "xtensa-lx106-elf-"
    for need, how in ((board_o, "make native"), (emu_cfg, "make xtensa-port"),
                      (Path(str(cross) + "gcc"), "make native"), (NATIVE / "mpsrc" / "py", "make native")):
        if not need.exists():
            return False, "%s is missing (%s)" % (need, how)
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, XTENSA_CROSS=str(cross), XTENSA_GNU_CONFIG=str(emu_cfg), PYTHON=sys.executable)
        r = subprocess.run([str(ROOT / "host" / "native" / "build.sh"), str(NATIVE / "mpsrc"), d, "xtensawin"],
                           env=env, capture_output=True, text=True, timeout=600)
        emu_o = Path(d) / "xtensawin" / "obj" / "build-xtensawin" / "mf_native.o"
        if r.returncode != 0 or not emu_o.is_file():
            return False, "building against the emulated core's description failed: " + (r.stdout + r.stderr)[-300:]
        if filecmp.cmp(str(emu_o), str(board_o), shallow=False):
            return True, ("mf_native.o built against the emulated core's description (no mulsh/muluh/recip0.s) "
                          "is byte for byte the board's (full ESP32-S3 description): the emulator runs the board's file")
        return False, ("mf_native.o differs between the emulated core's description and the board's: the board's "
                       "module uses an instruction the emulated core lacks (or the board's build is stale: make native)")


def judge_native_kernels(status, out, tol):
    """(ok, detail) of tests/mp/native_kernels_mp.py's output, judged as tests/mp/test_native.py
    judges it: an exit status of 0, every `ERR name value` line within tol, `DONE n` counting them."""
    import re
    errs = {}
    for ln in lines(out, "ERR "):
        name, value = ln[4:].rsplit(" ", 1)
        errs[name] = float(value)
    done = re.search(r"^DONE (\d+)$", out, re.M)
    bad = {k: v for k, v in errs.items() if not v <= tol}
    ok = status == 0 and bool(errs) and done is not None and int(done.group(1)) == len(errs) and not bad
    worst = max(errs, key=errs.get) if errs else None
    return ok, ("%d native-vs-portable comparisons on the emulated core, worst %.1e (%s; tolerance %g)"
                % (len(errs), errs[worst] if worst else float("nan"), worst, tol)
                + ("" if ok else "; beyond: %r %s" % (bad, out[-300:] if status or not done else "")))


def judge_native_selftest(status, out):
    """(ok, detail) of selftest_mp.py's output with the native module: SELFTEST True, and at least
    20 `native ...` golden lines, each PASS."""
    nat = [ln for ln in out.splitlines() if ln.startswith("native ")]
    fails = [ln for ln in nat if not ln.rstrip().endswith("PASS")]
    ok = status == 0 and "SELFTEST True" in out and len(nat) >= 20 and not fails
    return ok, ("%d golden checks on the native backend, all PASS" % len(nat) if ok
                else "; ".join(fails) or "%d native lines; %s" % (len(nat), out[-300:]))


def check_native(results, epochs=100, seeds=(1, 2, 3, 4, 5)):
    """The C kernels' xtensawin module (build/native/xtensawin/mf_native.mpy, the file a board gets)
    on the emulated core: the same file as a build for the emulated core; chosen by default with
    backend.why naming it; every kernel against the
    portable kernel (tests/mp/native_kernels_mp.py, judged as tests/mp/test_native.py judges it);
    the golden selftest on the native backend; board/demos/iris.py on native from five seeds (accuracy
    mean +- std, each seed learning the task and within one test sample of the x86 module's run of
    the same seed on the 32-bit port)."""
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "mp"), str(ROOT / "tests" / "oracles")]
    from test_native import TOL_PORTABLE
    same, detail = native_same_for_emulator()
    results.append(("native build", same, detail))
    if not NATIVE_MPY.is_file():
        results.append(("native", False, "%s is missing (make native)" % NATIVE_MPY))
        return
    import tempfile
    with tempfile.TemporaryDirectory() as d:       # chosen by default, as on a board, and said
        probe = Path(d) / "why.py"
        probe.write_text("import microformer as mf\nfrom microformer import backend\n"
                         "print('WHY', mf.get_backend(), '|', backend.why)\n")
        status, out, _ = xrun.run(str(probe), lib=True, files=[NATIVE_FILE], capture=True, timeout=120)
    why = (lines(out, "WHY ") or [out[-300:]])[0]
    ok = status == 0 and why.startswith("WHY native |") and "/lib/mf_native.mpy (xtensawin)" in why
    results.append(("native chosen", ok, "import microformer picks it: " + why[4:] if ok else why))
    status, out, _ = xrun.run(str(ROOT / "tests" / "mp" / "native_kernels_mp.py"), lib=True,
                              files=[NATIVE_FILE], capture=True, timeout=900)
    results.append(("native kernels",) + judge_native_kernels(status, out, TOL_PORTABLE))
    status, out = on_xtensa(HERE / "selftest_mp.py", files=GOLDEN + [NATIVE_FILE])
    results.append(("native selftest",) + judge_native_selftest(status, out))

    args = [str(epochs), ":".join(str(s) for s in seeds), "native"]
    status, out = on_xtensa(HERE / "iris_mp.py", args, files=["datasets/iris.csv:/data/iris.csv", NATIVE_FILE])
    got = [json.loads(ln) for ln in lines(out, "{")]
    if status != 0 or len(got) != len(seeds) or any(r["backend"] != "native" for r in got):
        results.append(("native iris", False, "no result: " + out[-300:]))
        return
    acc = [r["test_acc"] for r in got]
    mean = sum(acc) / len(acc)
    std = (sum((a - mean) ** 2 for a in acc) / (len(acc) - 1)) ** 0.5 if len(acc) > 1 else 0.0
    detail = ("native, %d epochs, seeds %s: train accuracy %s, test accuracy %.1f +- %.1f %% (mean +- std), "
              "final loss %s, %.2f s/epoch in QEMU" % (epochs, ",".join(map(str, seeds)),
                                                       " ".join("%.0f %%" % (100 * r["train_acc"]) for r in got),
                                                       100 * mean, 100 * std,
                                                       " ".join("%.4f" % r["final_loss"] for r in got),
                                                       got[0]["s_per_epoch"]))
    learnt = all(r["train_acc"] >= 0.9 and r["test_acc"] >= 0.85 for r in got)
    if not learnt:
        results.append(("native iris", False, detail + "; a seed did not learn (train < 90 % or test < 85 %)"))
        return
    x86 = NATIVE / "x86"
    ref_status, ref = on_mp32(HERE / "iris_mp.py", args, path="lib:board:board/demos:board/benchmarks:" + str(x86.relative_to(ROOT)))
    theirs = [json.loads(ln) for ln in lines(ref, "{")] if ref_status == 0 else []
    if len(theirs) != len(got) or any(r["backend"] != "native" for r in theirs):
        results.append(("native iris", False, detail + "; not compared with the x86 module on the 32-bit port: "
                        + ref[-200:].strip()))
        return
    close = all(abs(r["test_acc"] - q["test_acc"]) <= 1.0 / r["n_test"] + 1e-9 for r, q in zip(got, theirs))
    equal = all(r[k] == q[k] for r, q in zip(got, theirs) for k in ("final_loss", "train_acc", "test_acc"))
    results.append(("native iris", close, detail + ("; each seed's loss and accuracies equal to the x86 module's "
                                                    "on the 32-bit port" if equal else
                                                    "; test accuracy within one sample of the x86 module's on the "
                                                    "32-bit port (losses %s there)" % " ".join(
                                                        "%.4f" % q["final_loss"] for q in theirs)
                                                    if close else "; DIFFERS from the x86 module's %s" % theirs)))


CHECKS = ("selftest", "kernels", "viper_tests", "iris", "decode", "natmod", "native")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--only", action="append", choices=CHECKS)
    a = ap.parse_args(argv)
    if not xrun.FIRMWARE.is_file():
        print("make xtensa-test: %s is missing: run `make xtensa-port`" % xrun.FIRMWARE)
        return 2
    t0 = time.time()
    results = []
    for name in a.only or CHECKS:
        t = time.time()
        n = len(results)
        if name == "iris":
            check_iris(results, a.epochs)
        else:
            globals()["check_" + name](results)
        for r in results[n:]:
            print("%-4s %-24s %s" % ("ok" if r[1] else "FAIL", r[0], r[2]), flush=True)
        print("     (%s: %.0f s)" % (name, time.time() - t), flush=True)
    passed = sum(1 for r in results if r[1])
    failed = len(results) - passed
    print("xtensa-test (QEMU -M sim -cpu de233_fpu, %.0f s): %d passed, %d failed"
          % (time.time() - t0, passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
