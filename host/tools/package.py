"""make package: write the two mip packages of this repository.

lib/package.json     the microformer package (lib/microformer, what runs on a board)
board/package.json   the board session: finetune and the board modules it imports (mf_session,
                     mf_examples, ...), found by following finetune.py's imports, so a new helper
                     module is listed as soon as the session imports it

    mpremote mip install github:OWNER/REPO/lib github:OWNER/REPO/board    (from GitHub)
    mpremote mip install lib/package.json board/package.json              (from a local clone)

Both go to the board's /lib (on sys.path): then `import finetune; s = finetune.Session()` works
with a checkpoint at /model.mfck. mip resolves a package's "deps" only as absolute URLs (or
paths relative to where mpremote runs), never relative to the package.json; so the session
package names microformer in "requires" (for people; mip ignores the key) and both are installed
in one command. URLs are relative to each package.json, so forks work unchanged. `--check` fails
when either file is stale.
"""
import ast
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from board_link import ROOT, board_lib_files  # noqa: E402

LIB = ROOT / "lib"
BOARD = ROOT / "board"
TARGET = LIB / "package.json"
BOARD_TARGET = BOARD / "package.json"
SESSION_ENTRY = "finetune"


def version():
    init = (LIB / "microformer" / "__init__.py").read_text()
    return re.search(r'__version__ = "([^"]+)"', init).group(1)


def build():
    files = [p.relative_to(LIB).as_posix() for p in board_lib_files()]
    return {"urls": [[f, f] for f in files], "version": version()}


def _imports(path):
    """Top-level module names that `path` imports anywhere (also inside functions)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def session_modules(entry=SESSION_ENTRY):
    """board/*.py modules the session needs: `entry` and every board module it imports, transitively."""
    have = {p.stem for p in BOARD.glob("*.py")}
    todo, seen = [entry], set()
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        todo += sorted((_imports(BOARD / (m + ".py")) & have) - seen)
    return sorted(seen)


def build_board():
    files = [m + ".py" for m in session_modules()]
    return {"urls": [[f, f] for f in files], "requires": ["microformer (lib/package.json)"],
            "version": version()}


def render(pkg):
    return json.dumps(pkg, indent=2) + "\n"


def main(argv):
    targets = ((TARGET, build()), (BOARD_TARGET, build_board()))
    if "--check" in argv:
        stale = [str(t.relative_to(ROOT)) for t, pkg in targets
                 if not t.exists() or t.read_text() != render(pkg)]
        if stale:
            raise SystemExit("%s out of date: run `make package`" % " and ".join(stale))
        print("lib/package.json and board/package.json are up to date")
        return
    for t, pkg in targets:
        t.write_text(render(pkg))
        print("wrote %s (%d files: %s, version %s)" % (t.relative_to(ROOT), len(pkg["urls"]),
              ", ".join(u[0] for u in pkg["urls"]) if t == BOARD_TARGET else "lib/microformer",
              pkg["version"]))


if __name__ == "__main__":
    main(sys.argv[1:])
