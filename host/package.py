"""make package: write lib/package.json so mip can install microformer from this repository.

    mpremote mip install github:OWNER/REPO/lib/package.json     (from GitHub)
    mpremote mip install lib/package.json                       (from a local clone)
URLs are relative to package.json, so forks work unchanged. `--check` fails when it is stale.
"""
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from board_link import ROOT, board_lib_files  # noqa: E402

LIB = ROOT / "lib"
TARGET = LIB / "package.json"


def build():
    init = (LIB / "microformer" / "__init__.py").read_text()
    version = re.search(r'__version__ = "([^"]+)"', init).group(1)
    files = [p.relative_to(LIB).as_posix() for p in board_lib_files()]
    return {"urls": [[f, f] for f in files], "version": version}


def render():
    return json.dumps(build(), indent=2) + "\n"


def main(argv):
    text = render()
    if "--check" in argv:
        if not TARGET.exists() or TARGET.read_text() != text:
            raise SystemExit("lib/package.json is out of date: run `make package`")
        print("lib/package.json is up to date")
        return
    TARGET.write_text(text)
    print("wrote %s (%d files, version %s)" % (TARGET.relative_to(ROOT), len(build()["urls"]), build()["version"]))


if __name__ == "__main__":
    main(sys.argv[1:])
