"""make selftest: deploy, then run board/benchmarks/selftest.py on the board; exit 1 if any check fails.

    python host/tools/board_selftest.py [--port /dev/ttyACM0]
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from board_link import mpremote, resolve_port  # noqa: E402
from deploy import deploy  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", default=None, help="serial port of a board; empty: the virtual board")
    ap.add_argument("--no-deploy", action="store_true", help="run what is on the board already")
    a = ap.parse_args(argv)
    port = resolve_port(a.port)
    if not a.no_deploy:
        deploy(port)
    out = mpremote(port, "exec", "import selftest\nprint('SELFTEST', selftest.run())", timeout=600)
    sys.stdout.write(out)
    if "SELFTEST True" not in out:
        raise SystemExit("selftest FAILED on the board")


if __name__ == "__main__":
    main()
