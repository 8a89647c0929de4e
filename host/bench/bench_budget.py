"""Fine-tuning within a budget: one table of what each fine-tuning mode costs and recovers, on the
sensor model (build/sensor.mfck) and on a two-EncoderBlock encoder (E=64, H=4, S=32, about 100k
parameters; build/encoder.mfck), each on a drift task (board/benchmarks/budget.py documents both).

    python host/bench/bench_budget.py                      # the table (make bench-budget)
    python host/bench/bench_budget.py --models sensor --modes head,lora --no-callgrind
    python host/bench/bench_budget.py pretrain --out build/encoder.mfck    # the encoder checkpoint
    python host/bench/bench_budget.py goals [encoder,gesture,decode,cost]  # the goals (make bench-budget)

Per model and mode (full, head only, bias + LayerNorm only, LoRA r=4 on attention + FFN with the
head, the same with int8 frozen weights), on the 32-bit single-precision port (build/mp32, the
ESP32-like object sizes), viper backend:
- heap KB: the smallest -X heapsize from which every larger size tried runs one fine-tuning epoch
  (board/benchmarks/budget.py epoch: load the checkpoint, make the drifted data, fit one epoch);
- peak KB: the heap that epoch holds at its peak: gc.mem_alloc() after the first step and a
  collection (model, data, grads, optimizer state and every buffer, all kept), plus the most any
  later step allocates with the GC off (board/benchmarks/budget.py peak);
- Ir/sample: callgrind instructions per training sample, (runs of 2N steps - runs of N) / (N * batch);
- accuracy on the drifted held-out split before and after the fine-tune, and its difference from
  the full fine-tune's;
- the adapter file (checkpoint.save_adapter) against the full checkpoint, and with int8 the weight
  memory against float32.
A mode whose package part is missing (int8 needs microformer.quant) prints why in its row.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

import bench_common as bench

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DRIVER = os.path.join(ROOT, "board", "benchmarks", "budget.py")
DECODE_DRIVER = os.path.join(ROOT, "board", "benchmarks", "decode_goal.py")
MP32 = bench.MP32
CHECKPOINTS = {"sensor": os.path.join(ROOT, "build", "sensor.mfck"),
               "encoder": os.path.join(ROOT, "build", "encoder.mfck")}
MODELS = ("sensor", "encoder")
EPOCHS = {"sensor": 10, "encoder": 6}          # fine-tuning epochs for the accuracy column
CALLGRIND_STEPS = {"sensor": 4, "encoder": 1}   # N of the runs of N and 2N steps


def _board_import():
    for p in [os.path.join(ROOT, "lib")] + bench.BOARD_PATH:
        if p not in sys.path:
            sys.path.insert(0, p)
    import budget
    return budget


def pretrain(out, epochs=5, verbose=True):
    """Train the encoder on its undrifted task (CPython, NumPy backend when importable) and save
    it with its metadata; returns the result dict (accuracy undrifted and drifted)."""
    bb = _board_import()
    import microformer as mf
    from microformer.train import evaluate, fit_and_evaluate
    tr = bb.encoder_data(bb.ENC_PRETRAIN, False)
    te = bb.encoder_data(bb.ENC_PRETEST, False)
    model = bb.encoder_model()
    r = fit_and_evaluate(model, tr, te, epochs=epochs, batch_size=16, lr=1e-3, seed=1, verbose=verbose)
    drifted, _ = evaluate(model, bb.encoder_data(bb.ENC_TEST, True))
    meta = {"spec": mf.to_spec(model), "task": "classify", "classes": bb.ENC_CLASSES,
            "input_shape": [bb.ENC_S, bb.ENC_C], "epochs": epochs, "host_train_acc": r["train_acc"],
            "host_test_acc": r["test_acc"], "host_drifted_acc": drifted}
    d = os.path.dirname(os.path.abspath(out))
    os.makedirs(d, exist_ok=True)
    mf.save_checkpoint(out, model, meta=meta)
    print("encoder: %d parameters, accuracy %.1f %% (train %.1f %%), %.1f %% on the drifted test split; wrote %s"
          % (sum(p.size for p, _ in model.params()), 100 * r["test_acc"], 100 * r["train_acc"],
             100 * drifted, out))
    r["drifted_acc"] = drifted
    return r


def _env():
    return dict(os.environ, MICROPYPATH=os.pathsep.join([os.path.join(ROOT, "lib")] + bench.BOARD_PATH),
                PYTHONHASHSEED="0")


def _cmd(exe, heap, action, model, mode, extra=()):
    return [exe, "-X", "heapsize=" + heap, DRIVER, action, model, mode, CHECKPOINTS[model]] + [str(a) for a in extra]


def _parse(stdout, tag):
    m = re.search(r"^BUDGET %s (.*)$" % tag, stdout, re.M)
    if not m:
        return None
    return dict(kv.split("=", 1) for kv in m.group(1).split())


def missing(stdout):
    """The reason a mode cannot run in this package (the driver's 'BUDGET missing' line), or None."""
    m = re.search(r"^BUDGET missing (.*)$", stdout, re.M)
    return m.group(1) if m else None


def run(exe, heap, action, model, mode, extra=(), timeout=3600):
    """The driver's BUDGET fields of one run; {'missing': why} for a mode this package lacks.
    Any failure stops the bench with the command and its output."""
    cmd = _cmd(exe, heap, action, model, mode, extra)
    out = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    why = missing(out.stdout)
    if out.returncode == 0 and why:
        return {"missing": why}
    got = _parse(out.stdout, action)
    if out.returncode or got is None:
        raise SystemExit("bench-budget failed: %s\n%s%s" % (" ".join(cmd), out.stdout, out.stderr))
    return got


def _epoch_runs(exe, model, mode, kb):
    cmd = _cmd(exe, "%dK" % kb, "epoch", model, mode, (os.path.join(ROOT, "datasets"),))
    out = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=1800, cwd=ROOT)
    if out.returncode == 0 and _parse(out.stdout, "epoch"):
        return True
    if "MemoryError" in out.stdout + out.stderr:
        return False
    raise SystemExit("bench-budget epoch failed (not a MemoryError): %s\n%s%s" % (" ".join(cmd), out.stdout, out.stderr))


def smallest_heap(exe, model, mode, guess_kb):
    """The smallest -X heapsize (KB) from which every larger size tried runs one fine-tuning epoch:
    bisection between a size that fails and one that runs (from guess_kb, the measured peak), to
    a step of 1/64 of the size, then sizes 1, 2, 4 and 8 steps over it are verified
    (a failure there moves the answer above it: fragmentation makes the smallest heap no clean
    threshold). Returns (kb, runs)."""
    tried = {}

    def runs(kb):
        if kb not in tried:
            tried[kb] = _epoch_runs(exe, model, mode, kb)
        return tried[kb]
    lo = max(8, guess_kb // 2)
    while runs(lo):
        lo //= 2
        if lo < 8:
            raise SystemExit("bench-budget: %s/%s runs an epoch in under 8 KB" % (model, mode))
    hi = max(lo + 1, guess_kb * 3 // 2)
    while not runs(hi):
        lo, hi = hi, hi * 2
    step = max(1, hi // 64)
    while hi - lo > step:
        mid = (lo + hi) // 2
        if runs(mid):
            hi = mid
        else:
            lo = mid
    while True:
        bad = [hi + k * step for k in (1, 2, 4, 8) if not runs(hi + k * step)]
        if not bad:
            return hi, len(tried)
        hi = max(bad) + step
        while not runs(hi):
            hi += step


def callgrind_ir(exe, model, mode, steps):
    """Total instructions of a driver run of `steps` training steps under callgrind (heap 16M)."""
    cmd = _cmd(exe, "16M", "steps", model, mode, (steps, os.path.join(ROOT, "datasets")))
    n, r = bench.callgrind(cmd, _env(), 7200, cwd=ROOT)
    why = missing(r.stdout)
    if why:
        return None, why
    got = _parse(r.stdout, "steps")
    if r.returncode or n is None or not got:
        raise SystemExit("bench-budget callgrind failed: valgrind %s\n%s%s" % (" ".join(cmd), r.stdout, r.stderr))
    return n, int(got["batch"])


def ir_per_sample(exe, model, mode, n):
    """Instructions per training sample: (run of 2n steps - run of n steps) / (n * batch); the
    setup (import, checkpoint, data) cancels. (None, why) when the mode cannot run."""
    a, batch = callgrind_ir(exe, model, mode, n)
    if a is None:
        return None, batch
    b, _ = callgrind_ir(exe, model, mode, 2 * n)
    return (b - a) / float(n * batch), None


def measure(exe, model, mode, callgrind=True, heap=True):
    """Every figure of one (model, mode) row: a dict; {'missing': why} when the mode cannot run."""
    data_dir = os.path.join(ROOT, "datasets")
    row = {"model": model, "mode": mode}
    with tempfile.TemporaryDirectory() as d:
        acc = run(exe, "16M", "accuracy", model, mode, (EPOCHS[model], data_dir, os.path.join(d, "a.mfck")))
    if "missing" in acc:
        row["missing"] = acc["missing"]
        return row
    row.update(acc)
    peak = run(exe, "16M", "peak", model, mode, (data_dir,))
    row["peak"] = int(peak["peak"])
    row["ready"] = int(peak["ready"])
    if heap:
        row["heap_kb"], row["heap_runs"] = smallest_heap(exe, model, mode, row["peak"] // 1024)
    if callgrind:
        if shutil.which("valgrind"):
            row["ir"], _ = ir_per_sample(exe, model, mode, CALLGRIND_STEPS[model])
        else:
            row["ir_missing"] = "valgrind not found"
    return row


def _pct(a, b):
    return "%.0f %%" % (100.0 * a / b) if b else "-"


HEADER = "%-8s %-38s %9s %9s %12s %8s %8s %8s %8s %10s" % (
    "model", "mode", "heap KB", "peak KB", "Ir/sample", "Ir/full", "before", "after", "vs full", "trainable")


def format_row(row, full):
    """One line of the table; `full`: the same model's full fine-tune row (or None)."""
    bb = _board_import()
    what = bb.WHAT[row["mode"]]
    if "missing" in row:
        return "%-8s %-38s %s" % (row["model"], what, row["missing"])
    ir = row.get("ir")
    acc1 = float(row["after"])
    return "%-8s %-38s %9s %9.1f %12s %8s %7.1f%% %7.1f%% %8s %10s" % (
        row["model"], what, row.get("heap_kb", "-"), row["peak"] / 1024.0,
        "%.2fM" % (ir / 1e6) if ir else row.get("ir_missing", "-"),
        _pct(ir, full.get("ir")) if ir and full and full.get("ir") else "-",
        100 * float(row["before"]), 100 * acc1,
        "%+.1f" % (100 * (acc1 - float(full["after"]))) if full and "after" in full else "-",
        "%s/%s" % (row["trainable"], row["params"]))


def notes(rows):
    """The lines under the table: adapter sizes, weight memory with int8, peak ratios."""
    out = []
    by = dict(((r["model"], r["mode"]), r) for r in rows)
    for model in MODELS:
        full = by.get((model, "full"))
        for mode in ("head", "bias_norm", "lora", "lora_int8"):
            r = by.get((model, mode))
            if not r or "missing" in r or int(r["adapter"]) < 0:
                continue
            out.append("%s %s: adapter file %d bytes, %s of the %d-byte checkpoint" % (
                model, mode, int(r["adapter"]), _pct(int(r["adapter"]), int(r["checkpoint"])), int(r["checkpoint"])))
        lo = by.get((model, "lora"))
        if full and lo and "missing" not in lo:
            out.append("%s: peak heap full / LoRA = %.2fx%s" % (
                model, full["peak"] / float(lo["peak"]),
                ", smallest heap full / LoRA = %.2fx" % (full["heap_kb"] / float(lo["heap_kb"]))
                if "heap_kb" in full and "heap_kb" in lo else ""))
        q = by.get((model, "lora_int8"))
        if q and "missing" not in q:
            fw, qw, saved = int(q["frozen_w"]), int(q["q_w"]), int(q["q_saved"])
            out.append("%s: frozen weight matrices %.1f KB in float32, %.1f KB as int8 (%.2fx less); the heap "
                       "the conversion freed: %.1f KB; accuracy %+.1f points against LoRA in float32" % (
                           model, fw / 1024.0, qw / 1024.0, fw / float(max(1, qw)), saved / 1024.0,
                           100 * (float(q["after"]) - float(lo["after"])) if lo and "after" in lo else float("nan")))
    return out


def table(exe=MP32, models=MODELS, modes=None, callgrind=True, heap=True):
    """Measure and print the table, one line per row as it is measured. Returns the rows."""
    bb = _board_import()
    modes = modes or bb.MODES
    for m in models:
        if not os.path.exists(CHECKPOINTS[m]):
            raise SystemExit("bench-budget: no checkpoint %s (make %s)" % (CHECKPOINTS[m], os.path.relpath(CHECKPOINTS[m], ROOT)))
    print("fine-tuning within a budget: %s, viper backend, batch %d, Adam lr %s; heap KB: smallest -X heapsize"
          " running one epoch; peak KB: gc.mem_alloc after the first step and a collection, plus the most a later"
          " step allocates (GC off); Ir/sample: callgrind; accuracy on the drifted held-out"
          " split before / after the fine-tune (sensor %d epochs on 40 series, encoder %d epochs on %d sequences)"
          % (os.path.relpath(exe, ROOT), bb.BATCH, " ".join("%s %g" % (m, bb.LR[m]) for m in bb.MODES), EPOCHS["sensor"], EPOCHS["encoder"], bb.ENC_FINETUNE[1]),
          flush=True)
    print(HEADER, flush=True)
    rows = []
    for model in models:
        full = None
        for mode in modes:
            row = measure(exe, model, mode, callgrind, heap)
            if mode == "full":
                full = row
            rows.append(row)
            print(format_row(row, full), flush=True)
    for line in notes(rows):
        print("  " + line, flush=True)
    print("command: python host/bench/bench_budget.py (make bench-budget)", flush=True)
    return rows


# ---- the memory goals ------------------------------------------------------------------------
# (name, board/benchmarks/budget.py goal arguments, goal KB, what): the smallest -X heapsize (KB, bisected)
# from which two fit steps (or the decode) run on the 32-bit port, against the goal
GOALS = (
    ("encoder full", ("encoder", "full"), 2500, "E=64 encoder, full fine-tune, effective batch 8"),
    ("encoder lora", ("encoder", "lora"), 1000, "E=64 encoder, LoRA r=4 + head, effective batch 8"),
    ("encoder lora+int8", ("encoder", "lora_int8"), 512, "E=64 encoder, LoRA r=4 + head, int8 frozen weights"),
    ("encoder lora ckpt", ("encoder", "lora", "checkpoint"), 1000, "the LoRA fit with EncoderBlock.checkpoint on"),
    ("encoder int8 ckpt", ("encoder", "lora_int8", "checkpoint"), 512, "the LoRA + int8 fit with EncoderBlock.checkpoint on"),
    ("gesture", ("gesture",), 512, "Conv1D + EncoderBlock over 50x3 windows, fit at batch 16"),
    ("decode", ("decode",), 512, "causal E=32 char model, 318-token cache, not frozen: prefill + decode"),
)


# the gesture goal for the board session (finetune.Session on budget.gesture_flash's files)
GESTURE_SESSION_KB = 512


def _goal_env(path):
    # MICROPYPATH: lib/ and board/ as .py sources (path None) or the folders of their .mpy files
    # (bench.compiled_modules: as make deploy installs them on a board); the drivers stay .py
    if path is None:
        return _env()
    return dict(_env(), MICROPYPATH=os.pathsep.join(list(path) + [os.path.dirname(DRIVER)]))


def _goal_run(exe, args, kb, path=None):
    # the decode goal runs alone (decode_goal.py: microformer and nothing else imported, as a
    # program that only decodes); the fit goals through budget.py
    if args[0] == "decode":
        cmd = [exe, "-X", "heapsize=%dK" % kb, DECODE_DRIVER]
    else:
        cmd = [exe, "-X", "heapsize=%dK" % kb, DRIVER, "goal"] + list(args)
    out = subprocess.run(cmd, env=_goal_env(path), capture_output=True, text=True, timeout=1800, cwd=ROOT)
    got = _parse(out.stdout, "goal")
    if out.returncode == 0 and got:
        return got
    if "MemoryError" in out.stdout + out.stderr:
        return None
    raise SystemExit("bench-budget goal failed (not a MemoryError): %s\n%s%s" % (" ".join(cmd), out.stdout, out.stderr))


def goal_heap(exe, args, lo=64, hi=16384, path=None):
    """The smallest -X heapsize (KB) from which every size tried above it runs the goal: bisection
    to 1/64 of the size, then 1, 2, 4 and 8 steps over it verified (fragmentation). path: the .mpy
    folders to import lib/ and board/ from (compiled_modules), None: the .py sources. Returns
    (kb, the BUDGET fields of the run at kb: the plan's peak at the micro-batch it chose there)."""
    tried = {}

    def runs(kb):
        if kb not in tried:
            tried[kb] = _goal_run(exe, args, kb, path)
        return tried[kb] is not None
    if not runs(hi):
        raise SystemExit("bench-budget: goal %s does not run in %dK" % (" ".join(args), hi))
    while hi - lo > max(1, hi // 64):
        mid = (lo + hi) // 2
        if runs(mid):
            hi = mid
        else:
            lo = mid
    step = max(1, hi // 64)
    while True:
        if not runs(hi):                    # (a size above a failure, not run yet)
            hi += step
            continue
        bad = [hi + k * step for k in (1, 2, 4, 8) if not runs(hi + k * step)]
        if not bad:
            return hi, tried[hi]
        hi = max(bad) + step


# ---- instructions per training sample ---------------------------------------------------------
# board/benchmarks/cost.py runs STEPS steps of a model at its batch (train.fit, micro-batch and
# recompute as asked); callgrind counts runs of N and 2N steps, (2N - N) / (N * batch) per sample.
COST_DRIVER = os.path.join(ROOT, "board", "benchmarks", "cost.py")
COST_STEPS = {"iris": 10, "gesture": 2, "encoder-full": 1, "encoder-lora": 1}    # N: callgrind is slow


# Instructions per training sample of version 0.3.1 (commit 875ee1a: `git worktree add --detach
# /tmp/base 875ee1a`), each model at micro-batch = batch, measured 2026-12-06 by
#   cost_per_sample(MP32, model, lib="/tmp/base/lib")
# i.e. valgrind --tool=callgrind build/mp32/micropython32-sp -X heapsize=16M board/benchmarks/cost.py
# MODEL N (and 2N) with that tree's lib/ first on MICROPYPATH (this tree's cost.py and budget.py,
# whose models that version builds too), N = COST_STEPS.
COST_BASE_031 = {"iris": 534881.2, "gesture": 47241306.1, "encoder-lora": 284053663.1,
                 "encoder-full": 309009043.9}
COST_GOAL = 1.05                                  # at most 5 % above 0.3.1
COST_MICROS = ("encoder-full", (4, 2, 1))         # the smaller micro-batches whose cost is stated


def cost_goals(exe=MP32):
    """Print instructions per training sample at micro-batch = batch against 0.3.1's (met / missed
    at 5 %), then the cost of each smaller micro-batch of COST_MICROS against its whole batch.
    Callgrind is slow: one and two steps of the encoder (8 samples each), minutes per figure."""
    print("  instructions per training sample at micro-batch = batch (callgrind, %s, runs of N and 2N "
          "steps, N = %s; against 0.3.1, commit 875ee1a, goal <= +%d %%):" % (
              os.path.relpath(exe, ROOT), ", ".join("%s %d" % kv for kv in sorted(COST_STEPS.items())),
              round(100 * (COST_GOAL - 1))), flush=True)
    whole = {}
    for model in ("iris", "gesture", "encoder-lora", "encoder-full"):
        ir, got = cost_per_sample(exe, model)
        whole[model] = ir
        base = COST_BASE_031[model]
        print("    %-13s %12.1fk  0.3.1 %12.1fk  %+6.1f %%  %-6s  (%s)" % (
            model, ir / 1000.0, base / 1000.0, 100.0 * (ir / base - 1), "met" if ir <= COST_GOAL * base else "missed",
            "activations kept" if got["recompute"] == "keep" else "recomputed" if got["recompute"] == "recompute"
            else "no switch"), flush=True)
    model, micros = COST_MICROS
    for m in micros:
        ir, got = cost_per_sample(exe, model, m)
        print("    %s at micro-batch %d of %s: %.1fk per sample, %+.1f %% against the whole batch (%s)" % (
            model, m, got["batch"], ir / 1000.0, 100.0 * (ir / whole[model] - 1),
            "activations kept" if got["recompute"] == "keep" else "recomputed"), flush=True)


def cost_ir(exe, model, steps, micro=0, recompute="auto", lib=None):
    """Total instructions (callgrind) of a cost.py run of `steps` steps, and its COST fields; `lib`:
    the microformer package's folder (another tree's, for a baseline), default this tree's lib/."""
    env = dict(_env(), MICROPYPATH=os.pathsep.join([lib or os.path.join(ROOT, "lib")] + bench.BOARD_PATH))
    cmd = [exe, "-X", "heapsize=16M", COST_DRIVER, model, str(steps), str(micro), recompute]
    n, r = bench.callgrind(cmd, env, 7200, cwd=ROOT)
    m = re.search(r"^COST (.*)$", r.stdout, re.M)
    if r.returncode or n is None or not m:
        raise SystemExit("bench-budget callgrind failed: valgrind %s\n%s%s" % (" ".join(cmd), r.stdout, r.stderr))
    got = dict(kv.split("=", 1) for kv in m.group(1).split())
    return n, got


def cost_per_sample(exe, model, micro=0, recompute="auto", lib=None, n=None):
    """(instructions per training sample, the COST fields of the longer run): (run of 2n steps -
    run of n steps) / (n * batch); the setup (import, model, data, the memory plan) cancels."""
    n = n or COST_STEPS[model]
    a, _ = cost_ir(exe, model, n, micro, recompute, lib)
    b, got = cost_ir(exe, model, 2 * n, micro, recompute, lib)
    return (b - a) / float(n * int(got["batch"])), got


def goals(exe=MP32, names=None, iris=True):
    """Print each memory goal with its measured figure, met/missed, and the plan's peak beside it."""
    print("memory goals, %s, viper: smallest -X heapsize for two fit steps (bisected; micro_batch='auto') with "
          "lib/ and board/ as .mpy files, as make deploy installs them (.py sources beside it: compiling them "
          "at import takes heap and leaves it fragmented), and the plan's peak at the micro-batch the fit chose "
          "in that heap" % os.path.relpath(exe, ROOT), flush=True)
    flash = tempfile.mkdtemp(prefix="mf-goals-")
    try:
        path = bench.compiled_modules(exe, os.path.join(flash, "build"))
        for name, args, kb_goal, what in GOALS:
            if names and name.split()[0] not in names:
                continue
            kb, got = goal_heap(exe, args, path=path)
            kb_py, _ = goal_heap(exe, args)
            plan = int(got["plan_peak"])
            print("  %-18s %6d KB  goal <= %5d KB  %-6s  %s (.py sources: %d KB)%s" % (
                name, kb, kb_goal, "met" if kb <= kb_goal else "missed", what, kb_py,
                "; plan %d KB at micro-batch %s of %s (whole batch: %d KB)" % (
                    plan // 1024, got["micro"], got["batch"], int(got["plan_whole"]) // 1024) if plan >= 0 else ""),
                flush=True)
        if not names or "gesture" in names:
            # the gesture goal as stated: the model's board session, its default fit (batch 16)
            ck, data = _board_import().gesture_flash(flash)
            kb, _ = bench.smallest_session_heap(exe, ck, hi=4096, mpy=True, data=data)
            print("  %-18s %6d KB  goal <= %5d KB  %-6s  %s" % (
                "gesture session", kb, GESTURE_SESSION_KB, "met" if kb <= GESTURE_SESSION_KB else "missed",
                "the gesture model's board session (finetune.Session, default fit at batch 16, .mpy modules)"),
                flush=True)
    finally:
        shutil.rmtree(flash, ignore_errors=True)
    if iris:
        ck = os.path.join(ROOT, "build", "iris.mfck")
        if os.path.exists(ck):
            kb, _ = bench.smallest_session_heap(exe, ck, mpy=True)
            print("  %-18s %6d KB  goal <= %5d KB  %-6s  %s" % ("iris session", kb, 200, "met" if kb <= 200 else "missed",
                                                               "Iris fine-tune session, .mpy modules"), flush=True)
        else:
            print("  iris session: not measured: no %s (make pretrain)" % os.path.relpath(ck, ROOT), flush=True)
    if names and "cost" not in names:
        return
    if shutil.which("valgrind"):
        cost_goals(exe)
    else:
        print("  instructions per training sample: not measured: valgrind not found", flush=True)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "goals":
        if not os.path.exists(MP32):
            raise SystemExit("bench-budget: no interpreter at %s (make mp32 builds the 32-bit port)" % MP32)
        goals(MP32, argv[1].split(",") if len(argv) > 1 else None)
        return
    if argv and argv[0] == "pretrain":
        p = argparse.ArgumentParser(prog="bench_budget.py pretrain")
        p.add_argument("--out", default=CHECKPOINTS["encoder"])
        p.add_argument("--epochs", type=int, default=5)
        a = p.parse_args(argv[1:])
        pretrain(a.out, a.epochs)
        return
    p = argparse.ArgumentParser(prog="bench_budget.py")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--modes", default=None)
    p.add_argument("--exe", default=MP32)
    p.add_argument("--no-callgrind", action="store_true")
    p.add_argument("--no-heap", action="store_true", help="skip the smallest-heap bisection")
    a = p.parse_args(argv)
    if not os.path.exists(a.exe):
        raise SystemExit("bench-budget: no interpreter at %s (make mp32 builds the 32-bit port)" % a.exe)
    table(a.exe, a.models.split(","), a.modes.split(",") if a.modes else None, not a.no_callgrind, not a.no_heap)


if __name__ == "__main__":
    main()
