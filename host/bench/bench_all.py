# host/bench/bench_all.py: `make bench` — every benchmark in turn, one line per item as it is
# measured, recorded into host/results/bench-output.txt and rendered as host/results/PERFORMANCE.md
# (perfpage.py). The training-step tables run board/benchmarks/bench.py INSIDE the MicroPython unix ports,
# both backends (bench_common.py); then CPython, what a user's loop sustains (sustained.py), the
# Xtensa counts, the C kernels (bench_native.py), fine-tuning within a budget (bench_budget.py) and
# the speed goals (bench_goals.py). The iris rows are the faster of two alternating runs per
# backend (the machine may be shared).
#   python host/bench/bench_all.py [--heap 64M] [--callgrind] [--checkpoint build/iris.mfck]
import os
import shutil
import sys

import bench_common
from bench_common import (MP32, ROOT, _kb, callgrind_table, cpython_table, decode_table, fit_heap,
                          interpreters, memory, numpy_vs_torch, opt_instructions, smallest_session_heap,
                          table)


def main(argv):
    heap = "64M"
    if "--heap" in argv:
        heap = argv[argv.index("--heap") + 1]
    checkpoint = os.path.join(ROOT, "build", "iris.mfck")
    if "--checkpoint" in argv:
        checkpoint = argv[argv.index("--checkpoint") + 1]
    if not os.path.exists(checkpoint):
        raise SystemExit("bench: no pretrained checkpoint at %s (make pretrain)" % checkpoint)
    goals = {}                          # the figures bench_goals.py holds against the goals
    for name, exe, bits in interpreters():
        print("== %s: %s" % (name, exe), flush=True)
        table(exe, heap, bits)
        decode_table(exe)
        print("Iris heap (viper backend, gc.mem_alloc after a collection):", flush=True)
        m = memory(exe)
        print("  heap after import microformer: %s (the import added %s)" % (
            _kb(int(m["import"][0])), _kb(int(m["import"][1]))), flush=True)
        print("  heap after model + Adam + the first Iris step: %s" % _kb(int(m["first_step"][0])), flush=True)
        print("  garbage per steady-state step: %.0f B (mean over %s steps, GC off)" % (
            float(m["per_step"][0]), m["per_step"][1]), flush=True)
        steps, per = fit_heap(exe)
        print("  garbage per step of train.fit (Iris, batch 16, each epoch ending with a batch of 8):"
              " %.0f B (mean over %d steps = 3 whole epochs, GC off)" % (per, steps), flush=True)
        for mpy, kind in ((True, ".mpy modules, as make deploy installs them"), (False, ".py sources")):
            kb, tried = smallest_session_heap(exe, checkpoint, mpy=mpy)
            above = sorted(k for k in tried if k > kb)
            print("  smallest -X heapsize from which every larger size runs an Iris fine-tune session (%s): %d KB"
                  " (bisection, then %d larger sizes verified: every KB up to %d, and up to %d KB; %d runs)" % (
                      kind, kb, len(above), kb + 32, max(above), len(tried)), flush=True)
            if bits == 32:
                goals["session_kb" if mpy else "session_kb_py"] = kb
        key = "adam_mp32" if bits == 32 else "adam_stock"
        if shutil.which("valgrind"):
            ir = opt_instructions("adam", "viper", exe=exe)
            goals[key] = ir if ir else "callgrind gave no count"
            print("  Adam (viper): %s instructions per parameter per opt.step() (callgrind, Iris model)"
                  % ("%.0f" % ir if ir else "no count"), flush=True)
        else:
            goals[key] = "valgrind is not installed"
    cpython_table()
    goals["numpy_x"] = numpy_vs_torch()
    decode_table(None, ("python", "numpy"))
    if "--callgrind" in argv and shutil.which("valgrind"):
        callgrind_table(heap)
    if os.path.exists(MP32):                   # what a user's loop sustains (sustained.py)
        import sustained
        goals.update(sustained.goals(sustained.main(["--callgrind"] if shutil.which("valgrind") else [])))
    else:
        goals.update(dict.fromkeys(("decode_sustained", "decode_512k", "iris_x", "block_x", "session_kb",
                                    "session_kb_py", "adam_mp32"),
                                   "the 32-bit port is not built (make mp32)"))
    xtensa_table()                        # a section of its own: after the x86 figures it compares with
    import bench_native                   # the C kernels beside viper (make native builds them)
    goals.update(bench_native.main())
    import bench_budget                   # fine-tuning within a budget: its own table (make bench-budget)
    bench_budget.main([] if "--callgrind" in argv else ["--no-callgrind"])
    if os.path.exists(MP32):              # the memory goals (the Iris session's heap is measured above)
        bench_budget.goals(MP32, iris=False)
    import bench_goals                    # the speed goals against this run's figures, last
    bench_goals.table(goals)




def xtensa_table():
    """Xtensa instructions of real runs on the emulated core (host/xtensa/insns.py; make xtensa-port),
    next to the 32-bit port's x86 count of the same runs: the board-time figure that replaces
    make xtensa-report's estimate (whose assumed cycle costs stay in that report). Viper's rows and
    the native backend's (the board's build/native/xtensawin/mf_native.mpy there, x86's module on
    the 32-bit port; make bench builds them first)."""
    print("== Xtensa instructions (emulated core)", flush=True)
    if not os.path.exists(os.path.join(bench_common.ROOT, "build", "xtensa", "firmware.elf")):
        print("not counted: build/xtensa/firmware.elf is missing (make xtensa-port)", flush=True)
        return None
    sys.path.insert(0, os.path.join(bench_common.ROOT, "host", "xtensa"))
    import insns
    return insns.table(with_x86=bool(shutil.which("valgrind")))


if __name__ == "__main__":
    import perfpage                     # host/results/PERFORMANCE.md from what this run prints
    with perfpage.recorded([exe for _, exe, _ in interpreters()], command=" ".join(["host/bench/bench_all.py"] + sys.argv[1:])):
        main(sys.argv[1:])
