"""host/results/PERFORMANCE.md is made by `make bench` from what the bench printed (host/bench/perfpage.py).

Every figure on the page must be one the bench printed: the committed page is exactly what the
committed bench output renders to, and rendering never writes a number the output lacks. Sections
come from whatever the bench prints (a "== " line or a Markdown heading), so a new bench section
lands on the page with no change to the generator."""
import os
import re
import subprocess
import sys

import pytest

import helpers
import perfpage  # noqa: E402  (host/ is on the path: helpers)

NUMBER = re.compile(r"\d[\d,.]*")

OUTPUT = """STAMP date=2026-12-01 19:00 UTC ; commit=abc1234 ; command=host/bench/bench_all.py ; cpython=3.11.2 ; interpreter=.venv/bin/micropython: micropython 3.4.0; MicroPython v1.29.0
== stock 64-bit, double floats: /x/micropython
microformer training step inside /x/micropython (64M heap)
  measuring iris / python ...
iris   python     18.3   6.5
iris   viper      0.56   0.24    x32.7

### Sustained decoding (512K heap)

| backend | tokens/s | collected |
|---|---|---|
| viper | 4,210 | 5,120 |
note: 300 rounds, no collection between them
## Adam
| params | instructions/param |
|---|---|
| 475 | 287 |
"""


def _numbers(text):
    return set(NUMBER.findall(text))


def test_sections_tables_and_text_land_on_the_page():
    page = perfpage.render(OUTPUT)
    heads = [l for l in page.splitlines() if l.startswith("## ")]
    assert heads == ["## stock 64-bit, double floats: /x/micropython", "## Sustained decoding (512K heap)", "## Adam"]
    lines = page.splitlines()
    for row in ("| viper | 4,210 | 5,120 |", "| 475 | 287 |"):                       # tables stay tables,
        k = lines.index(row)
        assert sum(1 for l in lines[:k] if l.startswith("```")) % 2 == 0, row      # outside any fence
    assert "iris   viper      0.56   0.24    x32.7" in page                          # text stays text
    assert "measuring" not in page                                                  # progress lines go
    assert "2026-12-01 19:00 UTC" in page and "`abc1234`" in page and "MicroPython v1.29.0" in page
    body = page.split("## ", 1)[1]
    assert _numbers(body) <= _numbers(OUTPUT), _numbers(body) - _numbers(OUTPUT)


def test_an_output_without_its_stamp_is_refused():
    with pytest.raises(ValueError, match="first line must be the 'STAMP' line"):
        perfpage.render(OUTPUT.split("\n", 1)[1])
    with pytest.raises(ValueError, match="no commit="):
        perfpage.render(OUTPUT.replace("commit=abc1234 ; ", ""))


def test_recorded_writes_what_was_printed_and_the_page(tmp_path, capsys):
    page, raw = tmp_path / "P.md", tmp_path / "out.txt"
    with perfpage.recorded([], page=str(page), raw_path=str(raw), command="bench"):
        print("== a section")
        print("| a | b |\n|---|---|\n| 1 | 2 |")
        print("inside %s" % os.path.join(perfpage.ROOT, "build", "x"))
    assert "| 1 | 2 |" in capsys.readouterr().out                  # still printed as it goes
    assert "inside build/x\n" in raw.read_text()                    # project paths relative to it
    assert raw.read_text().startswith("STAMP ") and "| 1 | 2 |\ninside" in raw.read_text()
    assert page.read_text() == perfpage.render(raw.read_text())
    # a run that fails writes nothing
    with pytest.raises(RuntimeError):
        with perfpage.recorded([], page=str(tmp_path / "Q.md"), raw_path=str(tmp_path / "q.txt")):
            print("== half")
            raise RuntimeError("bench failed")
    assert not (tmp_path / "Q.md").exists() and not (tmp_path / "q.txt").exists()


@pytest.mark.skipif(not os.path.exists(perfpage.RAW), reason="no bench output committed yet (make bench)")
def test_the_committed_page_is_the_committed_bench_output():
    with open(perfpage.RAW) as f:
        raw = f.read()
    with open(perfpage.PAGE) as f:
        page = f.read()
    assert page == perfpage.render(raw), "host/results/PERFORMANCE.md was edited by hand or is stale: make bench"
    r = subprocess.run([sys.executable, os.path.join(helpers.BENCH, "perfpage.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
