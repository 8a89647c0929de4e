"""The gesture model's board session in a board's heap: README.md's From-PyTorch GestureNet
(Conv1D 3->16, ReLU, EncoderBlock(16, 2 heads, FFN 32, dropout 0.1), mean pool, 5 classes) as
board/benchmarks/budget.py gesture_flash puts it on a flash, `finetune.Session()`, its default fit
at batch 16 and evaluate (board/benchmarks/bench.py session), with lib/ and board/ compiled to
.mpy as `make deploy` sends them, on the 32-bit port: it runs in the heap its goal names
(host/bench/bench_budget.py GESTURE_SESSION_KB, 512 KB: an ESP32-S3 without PSRAM) and in every
size a little above it, and runs out of memory well below it (the bound is about the need)."""
import os
import subprocess
import sys

import pytest

import helpers
from test_finetune import board_mpy

GESTURE_SESSION_KB = 512


def _runs(exe, path, flash, kb):
    proc = subprocess.run([exe, "-X", "heapsize=%dK" % kb, "-c", "import bench; bench.session(%r)" % flash],
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, MICROPYPATH=path), cwd=flash)
    return proc.returncode == 0 and "SESSION ok " in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]


@pytest.mark.mp32
def test_gesture_session_runs_in_512k(tmp_path):
    exe = helpers.need_interpreter("mp32")
    sys.path.insert(0, os.path.join(helpers.ROOT, "board", "benchmarks"))
    try:
        import budget
    finally:
        sys.path.pop(0)
    flash = str(tmp_path / "f")
    os.makedirs(os.path.join(flash, "data"))
    ck, data = budget.gesture_flash(str(tmp_path))
    os.rename(ck, os.path.join(flash, "model.mfck"))
    os.rename(data, os.path.join(flash, "data", os.path.basename(data)))
    path = board_mpy(tmp_path / "mpy", exe)
    for kb in range(GESTURE_SESSION_KB, GESTURE_SESSION_KB + 25, 4):
        ok, out = _runs(exe, path, flash, kb)
        assert ok, "the gesture session no longer runs in a %d KB heap (goal %d KB):\n%s" % (kb, GESTURE_SESSION_KB, out)
    ok, out = _runs(exe, path, flash, GESTURE_SESSION_KB * 3 // 4)
    assert not ok and "MemoryError" in out, out
