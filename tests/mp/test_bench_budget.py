"""The fine-tuning-within-a-budget bench (host/bench/bench_budget.py driving board/benchmarks/budget.py) on
the stock port, one small model: its figures agree with what they count, computed here another
way. No timing is asserted (the figures are `make bench-budget`'s)."""
import os
import sys

import pytest

import helpers

sys.path.insert(0, os.path.join(helpers.ROOT, "host", "bench"))
import bench_budget as host_bb  # noqa: E402
import microformer as mf  # noqa: E402
import sensor  # noqa: E402

DRIVER = os.path.join(helpers.ROOT, "board", "benchmarks", "budget.py")
DATA = os.path.join(helpers.ROOT, "datasets")
FILTERS = 8                        # a narrower sensor model than the demo's 16: a faster test


@pytest.fixture(scope="module")
def small_sensor(tmp_path_factory):
    """An (untrained) sensor model FILTERS wide, saved with the standardization its data needs."""
    model = sensor.build_model(seed=2, filters=FILTERS)
    path = str(tmp_path_factory.mktemp("budget") / "sensor.mfck")
    mf.save_checkpoint(path, model, meta={"classes": sensor.CLASSES, "mean": [0.0] * sensor.CHANNELS,
                                          "std": [1.0] * sensor.CHANNELS})
    return path, model


def _driver(*args):
    out = helpers.run_micropython(DRIVER, *args, heap="16M")
    return out, host_bb._parse(out, args[0])


def test_head_only_trains_the_head_and_its_adapter_file_holds_only_it(small_sensor, tmp_path):
    path, model = small_sensor
    adapter = str(tmp_path / "head.mfck")
    out, got = _driver("accuracy", "sensor", "head", path, 1, DATA, adapter)
    assert got, out
    head = FILTERS * len(sensor.CLASSES) + len(sensor.CLASSES)        # Dense(F, 4): W and b
    total = sum(t.size for t in model.state_dict().values())
    assert int(got["trainable"]) == head
    assert int(got["params"]) == total
    assert int(got["checkpoint"]) == os.path.getsize(path)
    assert int(got["adapter"]) == os.path.getsize(adapter)
    # the adapter file leaves out exactly the frozen tensors (4 bytes a float); what remains of
    # the difference is the two files' headers and metadata (the checkpoint's spec and meta, the
    # adapter's base CRC): well under a KB each way
    frozen_bytes = 4 * (total - head)
    rest = int(got["checkpoint"]) - int(got["adapter"]) - frozen_bytes
    assert abs(rest) < 1024, (got, frozen_bytes)
    assert int(got["epochs"]) == 1 and int(got["steps"]) == (40 + 7) // 8     # 40 series, batch 8
    for k in ("before", "after", "train"):
        assert 0.0 <= float(got[k]) <= 1.0


def test_peak_and_steps_count_what_they_say(small_sensor):
    path, _ = small_sensor
    _, peak = _driver("peak", "sensor", "bias_norm", path, DATA)
    ready, live, garbage = int(peak["ready"]), int(peak["live"]), int(peak["garbage"])
    assert int(peak["peak"]) == live + garbage
    assert live > ready > 0 and garbage >= 0            # the first step adds buffers, grads, state
    assert int(peak["steps"]) == 5
    _, steps = _driver("steps", "sensor", "lora", path, 3, DATA)
    assert int(steps["steps"]) == 3 and int(steps["batch"]) == 8


def test_int8_row_reports_what_quant_converted(small_sensor, tmp_path):
    path, _ = small_sensor
    out, got = _driver("accuracy", "sensor", "lora_int8", path, 1, DATA, str(tmp_path / "q.mfck"))
    # quant.int8 converts the block's matrices (in_proj as its q, k, v rows), never the positions
    # table [25, F] or Conv1D's 3-D weight; int8: a byte per weight and a float32 scale per row
    F = FILTERS
    mats = [(F, F)] * 3 + [(F, F), (2 * F, F), (F, 2 * F)]
    assert got, out
    assert int(got["frozen_w"]) == 4 * sum(r * c for r, c in mats), out
    assert int(got["q_w"]) == sum(r * c + 4 * r for r, c in mats), out
    assert "int8: %d weight matrices" % len(mats) in out, out


def test_rows_and_notes_put_each_figure_against_the_full_fine_tune():
    full = {"model": "encoder", "mode": "full", "before": "0.4", "after": "0.9", "trainable": "100",
            "params": "100", "peak": 3 * 1024 * 1024, "heap_kb": 3000, "ir": 200e6, "adapter": "-1",
            "checkpoint": "4000"}
    lo = dict(full, mode="lora", after="0.885", trainable="10", params="110", peak=1024 * 1024,
              heap_kb=1000, ir=100e6, adapter="400")
    line = host_bb.format_row(lo, full)
    assert "100.00M" in line and "50 %" in line and "-1.5" in line and "10/110" in line
    q = dict(lo, mode="lora_int8", after="0.88", frozen_w="3500", q_w="1000", q_saved="2500")
    notes = host_bb.notes([full, lo, q])
    assert ("encoder: frozen weight matrices 3.4 KB in float32, 1.0 KB as int8 (3.50x less); the heap the"
            " conversion freed: 2.4 KB; accuracy -0.5 points against LoRA in float32") in notes
    assert "encoder lora: adapter file 400 bytes, 10 % of the 4000-byte checkpoint" in notes
    assert "encoder: peak heap full / LoRA = 3.00x, smallest heap full / LoRA = 3.00x" in notes
