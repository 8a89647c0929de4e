"""make board-report: selftest, bench and a short fine-tune on a board, in one file to share.

    python host/tools/board_report.py [--port /dev/ttyUSB0] [--checkpoint build/iris.mfck] [--epochs 2]
                                [--no-deploy] [--out build/board-report-DATE.md]

Deploys (unless --no-deploy), then over mpremote: what the board is (firmware, machine, unique id,
heap), board/benchmarks/selftest.py, board/benchmarks/bench.py on Iris, and a fine-tune of /model.mfck (evaluate, fit,
evaluate; nothing is saved, so the checkpoint on flash is unchanged). The report names the package
version and the commit it was deployed from. Exit status 1 when the selftest failed (the report
is written all the same: it is what to share).
"""
import argparse
import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "bench"))
from board_link import ROOT, mpremote, resolve_port  # noqa: E402
import perfpage  # noqa: E402

INFO = """import sys, gc, os
gc.collect()
u = os.uname() if hasattr(os, 'uname') else None
print('INFO firmware', sys.version, ('| ' + u.version) if u else '')
print('INFO machine', getattr(sys.implementation, '_machine', '') or (u.machine if u else '?'))
print('INFO platform', sys.platform)
try:
    import machine, binascii
    print('INFO board id', binascii.hexlify(machine.unique_id()).decode())
    print('INFO cpu MHz', machine.freq() // 1000000)
except Exception as e:
    print('INFO board id', 'n/a (%s)' % type(e).__name__)
print('INFO mpy', getattr(sys.implementation, '_mpy', 0))
print('INFO heap free', gc.mem_free())
print('INFO heap used', gc.mem_alloc())
import microformer
gc.collect()
print('INFO microformer', microformer.__version__, 'heap used after import', gc.mem_alloc())
"""
SELFTEST = "import selftest\nprint('SELFTEST', selftest.run())"
BENCH = "import bench\nbench.main(('iris',))"
FINETUNE = """import time, finetune
s = finetune.Session(verbose=False)
print('FT before', s.evaluate(verbose=False))
t0 = time.ticks_ms() if hasattr(time, 'ticks_ms') else int(time.time() * 1000)
s.fit(epochs=%d, verbose=False)
t1 = time.ticks_ms() if hasattr(time, 'ticks_ms') else int(time.time() * 1000)
print('FT after', s.evaluate(verbose=False))
print('FT fit ms', t1 - t0 if not hasattr(time, 'ticks_diff') else time.ticks_diff(t1, t0))
"""


def package_version():
    text = (Path(ROOT) / "lib" / "microformer" / "__init__.py").read_text()
    m = re.search(r'^__version__ = "([^"]+)"', text, re.M)
    if not m:
        raise SystemExit("board_report: no __version__ in lib/microformer/__init__.py")
    return m.group(1)


def _clean(out):
    return out.replace("\r", "").strip("\n")


def _info(out):
    got = {}
    for line in _clean(out).splitlines():
        if line.startswith("INFO "):
            key, _, value = line[5:].partition(" ")
            if key in ("board", "cpu", "heap"):
                k2, _, value = value.partition(" ")
                key += " " + k2
            got[key] = value.strip()
    return got


def render(when, port, info, selftest, bench, finetune, version, commit, epochs):
    """The report's Markdown (every argument a text the board printed, or what the host knows)."""
    passed = re.search(r"selftest: (\d+) passed, (\d+) failed", selftest)
    verdict = ("PASSED (%s checks)" % passed.group(1) if passed and passed.group(2) == "0" and "SELFTEST True" in selftest
               else "FAILED" + (" (%s passed, %s failed)" % passed.groups() if passed else ""))
    rows = [("firmware", info.get("firmware", "?")), ("machine", info.get("machine", "?")),
            ("platform", info.get("platform", "?")), ("board id", info.get("board id", "?")),
            ("CPU", "%s MHz" % info["cpu MHz"] if "cpu MHz" in info else "n/a"),
            ("heap (after gc.collect)", "%s B free, %s B used" % (info.get("heap free", "?"), info.get("heap used", "?"))),
            ("microformer on the board", info.get("microformer", "?")),
            ("package version (host)", version), ("commit (host)", commit), ("port", port)]
    md = ["# microformer board report, %s" % when, "",
          "Made by `make board-report` (host/tools/board_report.py). Selftest: **%s**." % verdict, "",
          "| | |", "|---|---|"] + ["| %s | %s |" % r for r in rows]
    for title, text in (("Selftest (board/benchmarks/selftest.py)", selftest), ("Bench (board/benchmarks/bench.py, Iris)", bench),
                        ("Fine-tune (/model.mfck, %d epochs, not saved)" % epochs, finetune)):
        md += ["", "## " + title, "", "```", _clean(text), "```"]
    return "\n".join(md) + "\n", verdict.startswith("PASSED")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", default=None, help="serial port of a board; empty: the virtual board")
    ap.add_argument("--checkpoint", default=str(Path(ROOT) / "build" / "iris.mfck"))
    ap.add_argument("--epochs", type=int, default=2, help="fine-tune epochs (default 2)")
    ap.add_argument("--no-deploy", action="store_true", help="report on what is on the board already")
    ap.add_argument("--out", default=None, help="the report file (default build/board-report-DATE.md)")
    a = ap.parse_args(argv)
    if a.epochs < 1:
        raise SystemExit("board_report: --epochs must be at least 1, got %d" % a.epochs)
    port = resolve_port(a.port)
    if not a.no_deploy:
        if not os.path.exists(a.checkpoint):
            raise SystemExit("board_report: no checkpoint at %s (make pretrain, or --checkpoint PATH)" % a.checkpoint)
        from deploy import deploy
        deploy(port, a.checkpoint)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print("board report: board info ...", flush=True)
    info = _info(mpremote(port, "exec", INFO, timeout=120))
    print("board report: selftest ...", flush=True)
    selftest = mpremote(port, "exec", SELFTEST, timeout=900, check=False)
    print("board report: bench ...", flush=True)
    bench = mpremote(port, "exec", BENCH, timeout=1800, check=False)
    print("board report: fine-tune ...", flush=True)
    finetune = mpremote(port, "exec", FINETUNE % a.epochs, timeout=1800, check=False)
    text, ok = render(when, port, info, selftest, bench, finetune, package_version(), perfpage.commit(), a.epochs)
    out = a.out or str(Path(ROOT) / "build" / ("board-report-%s.md" % time.strftime("%Y%m%d-%H%M%S", time.gmtime())))
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        f.write(text)
    print("board report: %s (selftest %s)" % (out, "passed" if ok else "FAILED"))
    if not ok:
        raise SystemExit(1)
    return out


if __name__ == "__main__":
    main()
