"""Heap the user feels, inside MicroPython (both interpreters, viper backend):
- train.fit on Iris over whole epochs, each ending with a smaller batch (board/benchmarks/bench.py fitheap:
  the figure make bench reports), allocates < 1 KB per step: a smaller batch runs on views of the
  largest batch's buffers, a batch shape seen before gets its buffers back;
- a buffer switch cut short by a KeyboardInterrupt at any buffer it draws or zeroes leaves the
  model usable, with the weights of the steps counted (tests/mp/fit_heap_mp.py);
- a Session fit of thousands of epochs on a 512K heap finishes, records and saves, and holds
  the same heap as a fit of 60 epochs: its history is bounded (tests/mp/fit_heap_mp.py longfit);
- greedy decoding through the KV cache (the decode stack of board/benchmarks/bench.py) allocates < 1 KB per
  token.
"""
import re

import helpers


def test_fit_heap_per_step(micropython):
    out = helpers.run_micropython(str(helpers.ROOT) + "/board/benchmarks/bench.py", "fitheap", "viper",
                                  heap="8M", exe=micropython)
    m = re.search(r"^FITHEAP viper (\d+) (\S+) (\d+) (\d+) (\d+)$", out, re.M)
    assert m, out
    steps, per, epochs, rows, batch = int(m.group(1)), float(m.group(2)), int(m.group(3)), int(m.group(4)), int(m.group(5))
    assert epochs >= 2 and rows % batch, "the measure must span whole epochs with a partial batch: %s" % m.group(0)
    assert steps == epochs * ((rows + batch - 1) // batch), m.group(0)
    assert 0 <= per < 1024, "train.fit: %.0f B per step (%d steps, %d epochs of %d rows, batch %d)" % (
        per, steps, epochs, rows, batch)


def test_switch_interrupted_anywhere(micropython):
    out = helpers.run_micropython(helpers.script("fit_heap_mp.py"), "viper", heap="4M", exe=micropython)
    for kind in ("draw", "zero"):
        m = re.search(r"^SWITCH %s (\d+) (\d+)$" % kind, out, re.M)
        assert m and int(m.group(1)) > 0 and int(m.group(2)) > 0, out


def test_decode_heap_per_token(micropython):
    out = helpers.run_micropython(str(helpers.ROOT) + "/board/benchmarks/bench.py", "decode", "viper", "gelu", "1",
                                  heap="8M", exe=micropython)
    m = re.search(r"^DECODE viper gelu (\S+) (\S+) ", out, re.M)
    assert m, out
    per_token = float(m.group(2))
    assert 0 <= per_token < 1024, "decode: %.0f B per token" % per_token


def test_long_fit_bounded_history(tmp_path, micropython):
    """s.fit(epochs=5000) (8 examples, batch 8: a step an epoch) on a 512K heap used to train every
    step and then fail building a record per epoch; now it finishes, is recorded and saved, and
    what it holds afterwards (the FitResult and the checkpoint's fit records) is what a 60-epoch
    fit holds, byte for byte on the heap."""
    flash = tmp_path / "flash"
    flash.mkdir()
    out = helpers.run_micropython(helpers.script("fit_heap_mp.py"), "longfit", "viper", str(flash),
                                  "60", "60", "5000", heap=helpers.board_heap(micropython), exe=micropython)
    fits = {}
    for m in re.finditer(r"^LONGFIT (\d+) (\d+) (\d+) (\d+) (\d+) (\d+) (\d+) (\d+) (\d+) (\d)$", out, re.M):
        v = [int(g) for g in m.groups()]
        asked, epochs, steps, kept, first, last, held, fit_records, meta_bytes, interrupted = v
        assert epochs == steps == asked and not interrupted, m.group(0)
        assert last == asked and first == last - kept + 1 and 0 < kept <= asked, m.group(0)
        fits.setdefault(asked, []).append((kept, held, meta_bytes))
    assert sorted(fits) == [60, 5000] and len(fits[60]) == 2, out
    kept60, held60, bytes60 = fits[60][1]           # the second: the optimizer exists already
    kept, held, meta_bytes = fits[5000][0]
    assert kept == kept60 < 60, "the FitResult keeps %d epoch records of 5000" % kept
    assert held <= held60, "a 5000-epoch fit holds %d bytes, a 60-epoch fit %d" % (held, held60)
    assert meta_bytes < 2 * bytes60, "the checkpoint's fit records: %d bytes" % meta_bytes
    m = re.search(r"^SAVED (\d+) (\d+) (\d+) (\d+)$", out, re.M)
    assert m and [int(g) for g in m.groups()] == [3, 5120, 5120, 3], out
