"""Write the viper kernel modules lib/microformer/viper_*.py from their sources in host/viper/.

    python host/gen_viper.py            # (re)write every generated module
    python host/gen_viper.py --check    # exit 1 and name the stale ones if any differ

A viper function cannot call another one cheaply (a call costs about as much as a Python call), so
the hot loops carry their helpers inline. Each helper is written once, as a snippet in
host/viper/snippets.py: a function whose parameters name the variables it reads and writes and
whose body is the code. A source line

        #@ store(pw, oi, acc, e)

is replaced by that body, indented like the line, with each parameter renamed to the argument in
its place (parameters left out keep their own names). A snippet body may use other snippets.
A kernel's pointer declarations are one line too: `#@ ptr32(po=out, pa=a)` (likewise ptr8 and
ptr16) becomes `po = ptr32(out)` and `pa = ptr32(a)`, one per line.
Every other line is copied as it is; `#!chk` markers (tests/test_viper.py) come along.
"""
import argparse
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "host" / "viper"
OUT = ROOT / "lib" / "microformer"
SNIPPETS = SRC / "snippets.py"
# generated module -> its source; kernels_viper.py (hand-written) gathers them in one namespace
MODULES = ("common", "gemm", "softmax", "optim", "elementwise", "conv", "sequence", "norm")

_USE = re.compile(r"^(\s*)#@ (\w+)\((.*)\)\s*$")
_WORD = re.compile(r"\b[A-Za-z_]\w*\b")
_DEF = re.compile(r"^def (\w+)\(([\w, ]*)\):\s*$")


def load_snippets(path=SNIPPETS):
    """name -> (parameter names, body lines without their common indent). A snippet is a `def` at
    the left margin, a docstring (not emitted), and the indented lines after it."""
    lines = path.read_text().splitlines()
    out = {}
    n = 0
    while n < len(lines):
        m = _DEF.match(lines[n])
        n += 1
        if not m:
            if lines[n - 1].startswith("def "):
                raise ValueError("%s:%d: a snippet is `def name(a, b):` on one line" % (path.name, n))
            continue
        name, params = m.group(1), [a.strip() for a in m.group(2).split(",") if a.strip()]
        start = n
        while n < len(lines) and (not lines[n].strip() or lines[n][0] in " \t"):
            n += 1
        chunk = lines[start:n]
        quote = chunk[0].strip()[:3] if chunk else ""
        if quote not in ('"""', "'''") or name in out:
            raise ValueError("%s:%d: snippet %s needs a docstring and a name of its own" % (path.name, start, name))
        k = 0                                   # the line that closes the docstring
        if chunk[0].strip().count(quote) < 2:
            k = 1
            while k < len(chunk) and quote not in chunk[k]:
                k += 1
        body = chunk[k + 1:]
        while body and not body[-1].strip():
            body.pop()
        if not body:
            raise ValueError("%s:%d: snippet %s has no body" % (path.name, start, name))
        indent = min(len(t) - len(t.lstrip()) for t in body if t.strip())
        out[name] = (params, [t[indent:] for t in body])
    return out


def _rename(line, mapping):
    return _WORD.sub(lambda m: mapping.get(m.group(0), m.group(0)), line)


_PTRS = ("ptr8", "ptr16", "ptr32")
_PAIR = re.compile(r"^([A-Za-z_]\w*)=([A-Za-z_]\w*)$")


def _pointers(kind, args, where):
    """`#@ ptr32(po=out, pa=a)` -> ["po = ptr32(out)", "pa = ptr32(a)"]."""
    out = []
    for a in args.split(","):
        m = _PAIR.match(a.strip())
        if not m:
            raise ValueError("%s: %s(...) takes name=buffer pairs, got %r" % (where, kind, a.strip()))
        out.append("%s = %s(%s)" % (m.group(1), kind, m.group(2)))
    return out


def expand(lines, snippets, where, depth=0):
    """The lines with every `#@ name(args)` replaced by its snippet body."""
    if depth > 8:
        raise ValueError("%s: snippets nest deeper than 8 (a snippet using itself?)" % where)
    out = []
    for n, line in enumerate(lines, 1):
        m = _USE.match(line)
        if not m:
            out.append(line)
            continue
        indent, name, args = m.group(1), m.group(2), m.group(3)
        if name in _PTRS:
            out.extend(indent + s for s in _pointers(name, args, "%s:%d" % (where, n)))
            continue
        if name not in snippets:
            raise ValueError("%s:%d: unknown snippet %r (known: %s)" % (where, n, name, ", ".join(sorted(snippets))))
        params, body = snippets[name]
        args = [a.strip() for a in args.split(",")] if args.strip() else []
        if len(args) > len(params):
            raise ValueError("%s:%d: %s takes at most %d arguments %r, got %d" % (where, n, name, len(params), params, len(args)))
        mapping = dict(zip(params, args))
        body = [_rename(s, mapping) for s in body]
        for s in expand(body, snippets, "%s:%d %s" % (where, n, name), depth + 1):
            out.append((indent + s) if s.strip() else "")
    return out


def generate(name, snippets=None):
    """The text of lib/microformer/viper_<name>.py."""
    snippets = snippets if snippets is not None else load_snippets()
    src = SRC / (name + ".py")
    lines = src.read_text().splitlines()
    head = ["# GENERATED by host/gen_viper.py from host/viper/%s.py and host/viper/snippets.py:" % name,
            "# do not edit; edit those and run `make viper` (tests/test_viper_split.py checks it is current)."]
    return "\n".join(head + expand(lines, snippets, os.path.relpath(src, ROOT))) + "\n"


def target(name):
    return OUT / ("viper_%s.py" % name)


def stale():
    """The generated modules whose text on disk differs from what the sources give."""
    snippets = load_snippets()
    return [target(n) for n in MODULES
            if not target(n).exists() or target(n).read_text() != generate(n, snippets)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="only report modules that are not current")
    a = ap.parse_args(argv)
    if a.check:
        bad = stale()
        for p in bad:
            print("not current: %s (run make viper)" % p.relative_to(ROOT))
        return 1 if bad else 0
    snippets = load_snippets()
    for n in MODULES:
        text = generate(n, snippets)
        p = target(n)
        if not p.exists() or p.read_text() != text:
            p.write_text(text)
            print("wrote %s" % p.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
