"""Write the viper kernel modules lib/microformer/viper_*.py from their sources in host/viper/.

    python host/viper/gen_viper.py            # (re)write every generated module
    python host/viper/gen_viper.py --check    # exit 1 and name the stale ones if any differ
    python host/viper/gen_viper.py --where lib/microformer/viper_optim.py:420
                                        # the source line a generated line came from

A viper function cannot call another one cheaply (a call costs about as much as a Python call), so
the hot loops carry their helpers inline. Each helper is written once, as a snippet in
host/viper/snippets.py: a function with a docstring whose body is the code. Every file in
host/viper/ is Python (it parses); a kernel uses a snippet by calling it as a statement on a line
of its own,

        store(pw, oi, acc, e)

and the generator replaces that line by the snippet's body, indented like the line, with each
parameter renamed to the argument in its place (parameters left out keep their own names; an
argument that is an expression is put in parentheses). A snippet body may use other snippets.

A snippet is inlined into its caller's scope, so it has no locals of its own: it names everything
it touches. Its parameters, and the lines after its docstring

    # in: x, sx, BL          (names of the caller it reads, by their own names)
    # out: s, bm, bad        (names of the caller it writes, its scratch included)

The generator refuses a snippet that reads or writes a name it does not declare (builtins such as
range and ptr32 excepted), that writes an `in:` name, that declares a name it does not use, or
that escapes with return, or with break/continue outside a loop of its own: control flow that
leaves the snippet belongs in the kernel (the snippet sets a flag the caller tests).

Every generated line can be traced back: a comment `# from host/viper/X.py:N (snippet Y)` says
that the lines after it, up to the next such comment, are lines N, N+1, ... of X (renamed when
they come from snippet Y). Each function starts with one. Comments cost nothing in .mpy, and
`#!chk` markers (tests/mp/test_viper.py) come along with their names renamed.
"""
import argparse
import ast
import builtins
import io
import re
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "host" / "viper"
OUT = ROOT / "lib" / "microformer"
SNIPPETS = SRC / "snippets.py"
# generated module -> its source; kernels_viper.py (hand-written) gathers them in one namespace
MODULES = ("common", "gemm", "softmax", "optim", "elementwise", "conv", "sequence", "norm", "rows", "q8")

# names a snippet may use without declaring them
BUILTINS = frozenset(("range", "len", "int", "uint", "bool", "ptr8", "ptr16", "ptr32"))
_DECL = re.compile(r"^\s*# (in|out):(.*)$")
_CHK = re.compile(r"(#!chk )(\w+(?:, \w+)*)")
_MARK = re.compile(r"^\s*# from (\S+):(\d+)(?: \(snippet (\w+)\))?$")
MAX_DEPTH = 8


class Snippet:
    """One snippet: name, params, inputs/outputs (declared caller names), body (dedented lines)
    with the source line of each, path and line of its def."""

    def __init__(self, name, params, inputs, outputs, body, lines, path, line):
        self.name, self.params, self.inputs, self.outputs = name, params, inputs, outputs
        self.body, self.lines, self.path, self.line = body, lines, path, line

    def where(self):
        return "%s:%d (snippet %s)" % (_rel(self.path), self.line, self.name)


def _rel(path):
    """How a comment names a source: host/viper/X.py for the sources (wherever SRC is), else
    relative to the repository if inside it."""
    path = Path(path)
    if path.parent == SRC:
        return "host/viper/" + path.name
    if path.is_absolute() and ROOT in path.parents:
        return str(path.relative_to(ROOT))
    return str(path)


def _parse(text, where):
    try:
        return ast.parse(text)
    except SyntaxError as e:
        raise ValueError("%s:%s: not Python: %s" % (where, e.lineno, e.msg)) from None


def _names(text):
    return [a.strip() for a in text.split(",") if a.strip()]


def _snippet(fn, lines, path):
    """The Snippet of a def node; lines: the file's lines."""
    where = "%s:%d" % (_rel(path), fn.lineno)
    a = fn.args
    if fn.decorator_list or a.vararg or a.kwarg or a.kwonlyargs or a.defaults or a.posonlyargs:
        raise ValueError("%s: snippet %s takes plain parameters only (no decorators, defaults, *args)"
                         % (where, fn.name))
    doc = fn.body[0]
    if not (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)
            and isinstance(doc.value.value, str)) or len(fn.body) < 2:
        raise ValueError("%s: snippet %s needs a docstring and a body" % (where, fn.name))
    end = fn.end_lineno                  # trailing comments belong to it too, up to the next def
    while end < len(lines) and (not lines[end].strip() or lines[end][0] in " \t"):
        end += 1
    decl = {"in": [], "out": []}
    body, nums = [], []
    for n in range(doc.end_lineno + 1, end + 1):
        text = lines[n - 1]
        m = _DECL.match(text)
        if m:
            decl[m.group(1)] += _names(m.group(2))
        else:
            body.append(text)
            nums.append(n)
    while body and not body[-1].strip():
        body.pop()
        nums.pop()
    indent = min(len(t) - len(t.lstrip()) for t in body if t.strip())
    return Snippet(fn.name, [p.arg for p in a.args], decl["in"], decl["out"],
                   [t[indent:] for t in body], nums, Path(path), fn.lineno)


def load_snippets(path=None, check=True):
    """name -> Snippet of the file at path (SNIPPETS), every one checked (see check_snippet)
    unless check is false."""
    path = Path(path or SNIPPETS)
    text = path.read_text()
    lines = text.splitlines()
    out = {}
    for node in _parse(text, _rel(path)).body:
        if not isinstance(node, ast.FunctionDef):
            raise ValueError("%s:%d: snippets.py holds snippets (defs) only, got %s"
                             % (_rel(path), node.lineno, type(node).__name__))
        if node.name in out:
            raise ValueError("%s:%d: a second snippet named %s" % (_rel(path), node.lineno, node.name))
        out[node.name] = _snippet(node, lines, path)
    if check:
        done = set()
        for s in out.values():
            check_snippet(s, out, done)
    return out


def _escapes(node, loops=0):
    """(line, what) of the first statement in node that leaves the inlined code: return anywhere,
    break or continue outside a loop of their own; also what an inlined body cannot hold (def,
    lambda, class, global); None when there is none."""
    if isinstance(node, (ast.Return, ast.Yield, ast.YieldFrom)):
        return node.lineno, "return"
    if isinstance(node, (ast.FunctionDef, ast.Lambda, ast.ClassDef, ast.Global, ast.Nonlocal)):
        return node.lineno, type(node).__name__
    if isinstance(node, (ast.Break, ast.Continue)) and not loops:
        return node.lineno, type(node).__name__.lower()
    for field, value in ast.iter_fields(node):
        inner = loops + 1 if isinstance(node, (ast.For, ast.While)) and field == "body" else loops
        for child in value if isinstance(value, list) else [value]:
            if isinstance(child, ast.AST):
                hit = _escapes(child, inner)
                if hit:
                    return hit
    return None


def _uses(tree):
    """(read names, written names) of a parsed body; an augmented assignment both reads and writes."""
    reads, writes = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (writes if isinstance(node.ctx, ast.Store) else reads).add(node.id)
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            reads.add(node.target.id)
    return reads, writes


def check_snippet(s, snippets, done=None, depth=0):
    """Refuse a snippet that escapes its caller's control flow or touches an undeclared name (the
    snippets it uses first, so that a refusal names the one at fault; done: those checked)."""
    done = set() if done is None else done
    if s.name in done or depth > MAX_DEPTH:
        return
    tree = _parse("\n".join(s.body), s.where())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in snippets:
            check_snippet(snippets[node.func.id], snippets, done, depth + 1)
    hit = _escapes(tree)
    if hit:
        raise ValueError("%s:%d: snippet %s leaves its caller's control flow (%s): set a flag it "
                         "declares as out: and let the kernel act on it"
                         % (_rel(s.path), s.lines[hit[0] - 1], s.name, hit[1]))
    declared = s.params + s.inputs + s.outputs
    twice = sorted(n for n in set(declared) if declared.count(n) > 1)
    if twice:
        raise ValueError("%s: declares %s more than once (parameters, in:, out:)" % (s.where(), twice))
    items = [(t, (s.path, n, s.name)) for t, n in zip(s.body, s.lines)]
    body = [t for t, _ in _expand(items, snippets, 1)]
    reads, writes = _uses(_parse("\n".join(body), s.where()))
    bad = sorted(set(s.inputs) & writes)
    if bad:
        raise ValueError("%s writes %s, declared in: (declare it out:)" % (s.where(), ", ".join(bad)))
    known = set(declared) | BUILTINS
    for what, names, ok, decl in (("writes", writes, set(s.params + s.outputs), "out:"),
                                  ("reads", reads, known, "in:")):
        bad = sorted(names - ok)
        if bad:
            raise ValueError("%s %s %s, which it does not declare: make them parameters or add them "
                             "to its `# %s` line" % (s.where(), what, ", ".join(bad), decl))
    bad = [n for n in declared if n not in reads | writes]
    if bad:
        raise ValueError("%s declares %s but does not use it" % (s.where(), ", ".join(bad)))
    done.add(s.name)


def _rename(lines, mapping):
    """lines (complete statements) with every name in mapping replaced: names in the code (not
    attributes) and those a `#!chk` comment lists. Simultaneous: a -> b and b -> a swap."""
    if not mapping:
        return list(lines)
    out = [list(t) for t in lines]
    edits = []
    prev = None
    for tok in tokenize.generate_tokens(io.StringIO("\n".join(lines) + "\n").readline):
        if tok.type == tokenize.NAME and tok.string in mapping and not (prev and prev.string == "."):
            edits.append((tok.start, tok.end, mapping[tok.string]))
        elif tok.type == tokenize.COMMENT:
            m = _CHK.search(tok.string)
            if m:
                new = ", ".join(mapping.get(v, v) for v in _names(m.group(2)))
                c = tok.start[1] + m.start(2)
                edits.append(((tok.start[0], c), (tok.start[0], c + len(m.group(2))), new))
        if tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT):
            prev = tok
    for (row, c0), (_, c1), new in reversed(edits):
        out[row - 1][c0:c1] = list(new)
    return ["".join(t) for t in out]


def _arg(node, line):
    """The text of an argument as written, and in parentheses when it is an expression other
    than a name, a number, an index or a call (a + b must stay one operand)."""
    text = line.encode()[node.col_offset:node.end_col_offset].decode()
    atom = (ast.Name, ast.Constant, ast.Subscript, ast.Call, ast.Attribute)
    return text, text if isinstance(node, atom) else "(%s)" % text


def _substitute(s, args, where):
    """The body of snippet s with its parameters renamed to the arguments args [(bare, safe)]:
    the safe (parenthesized) forms, or the bare ones where that parses to the same code."""
    safe = _rename(s.body, {p: a[1] for p, a in zip(s.params, args)})
    if all(b == c for b, c in args):
        return safe
    bare = _rename(s.body, {p: a[0] for p, a in zip(s.params, args)})
    same = ast.dump(_parse("\n".join(bare), where)) == ast.dump(_parse("\n".join(safe), where))
    return bare if same else safe


def _where(origin):
    path, n, name = origin
    return "%s:%d%s" % (_rel(path), n, " (snippet %s)" % name if name else "")


def _expand(items, snippets, depth):
    """items (text, origin) with every snippet use replaced by the renamed, indented body; origin
    = (path, line, snippet name or None) of each line."""
    if depth > MAX_DEPTH:
        raise ValueError("%s: snippets nest deeper than %d (a snippet using itself?)"
                         % (_where(items[0][1]), MAX_DEPTH))
    tree = _parse("\n".join(t for t, _ in items), _where(items[0][1]) if items else "?")
    uses = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) \
                and isinstance(node.value.func, ast.Name) and node.value.func.id in snippets:
            uses[node.lineno] = node
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in snippets \
                and node.lineno not in uses:
            raise ValueError("%s: snippet %s used as a value; a snippet is a statement of its own"
                             % (_where(items[node.lineno - 1][1]), node.func.id))
    out = []
    for n, (line, origin) in enumerate(items, 1):
        node = uses.get(n)
        if node is None:
            out.append((line, origin))
            continue
        call, where = node.value, _where(origin)
        rest = line[node.end_col_offset:].strip()
        if node.end_lineno != n or line[:node.col_offset].strip() or (rest and not rest.startswith("#")):
            raise ValueError("%s: a snippet use is a call on a line of its own" % where)
        s = snippets[call.func.id]
        if call.keywords or any(isinstance(a, ast.Starred) for a in call.args):
            raise ValueError("%s: %s(...) takes positional arguments only" % (where, s.name))
        if len(call.args) > len(s.params):
            raise ValueError("%s: %s takes at most %d arguments %r, got %d"
                             % (where, s.name, len(s.params), s.params, len(call.args)))
        args = [_arg(a, line) for a in call.args]
        body = [(t, (s.path, k, s.name)) for t, k in zip(_substitute(s, args, where), s.lines)]
        indent = line[:node.col_offset]
        for t, o in _expand(body, snippets, depth + 1):
            out.append(((indent + t) if t.strip() else "", o))
    return out


def _render(items, starts):
    """The lines with a `# from` comment wherever a line does not follow its predecessor in the
    same source, and before every line whose origin is in starts (a function's first line)."""
    out = []
    prev = None
    for k, (text, origin) in enumerate(items):
        follows = prev is not None and prev[0] == origin[0] and prev[2] == origin[2] \
            and prev[1] + 1 == origin[1]
        if not follows or origin in starts:
            nxt = next((t for t, _ in items[k:] if t.strip()), "")
            out.append(nxt[:len(nxt) - len(nxt.lstrip())] + "# from " + _where(origin))
        out.append(text)
        prev = origin
    return out


def expand(lines, snippets, path, starts=()):
    """The lines of the kernel source at path with every snippet use inlined and the `# from`
    comments in place (one before each line number in starts too)."""
    items = [(t, (Path(path), n, None)) for n, t in enumerate(lines, 1)]
    return _render(_expand(items, snippets, 0), {(Path(path), n, None) for n in starts})


def generate(name, snippets=None):
    """The text of lib/microformer/viper_<name>.py."""
    snippets = snippets if snippets is not None else load_snippets()
    src = SRC / (name + ".py")
    text = src.read_text()
    tree = _parse(text, _rel(src))
    starts = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            if node.name in snippets:
                raise ValueError("%s:%d: %s is a snippet's name; a kernel function needs its own"
                                 % (_rel(src), node.lineno, node.name))
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            starts.append(first)
    lines = expand(text.splitlines(), snippets, src, starts)
    head = ["# GENERATED by host/viper/gen_viper.py from host/viper/%s.py and host/viper/snippets.py:" % name,
            "# do not edit; edit those and run `make viper` (tests/mp/test_viper_split.py checks it is current)."]
    out = "\n".join(head + lines) + "\n"
    _parse(out, "%s (generated from %s)" % (target(name).name, _rel(src)))
    for n, fn, used in undefined(out):
        path, k, snippet = source_of(out.splitlines(), n)
        raise ValueError("%s:%d%s: %s reads %s, which %s does not set (a snippet's `# in:` name the "
                         "caller must provide)" % (path, k, " (snippet %s)" % snippet if snippet else "",
                                                   fn, used, fn))
    return out


def _stored(node):
    """The names node binds: assignments and imports (a function may import on first use)."""
    return ({x.id for x in ast.walk(node) if isinstance(x, ast.Name) and isinstance(x.ctx, ast.Store)}
            | {(a.asname or a.name).split(".")[0] for x in ast.walk(node)
               if isinstance(x, (ast.Import, ast.ImportFrom)) for a in x.names})


def undefined(text):
    """(line, function, name) of each name a function of the module text reads but neither it nor
    the module sets (nor Python or viper provides): a snippet's `# in:` name its caller lacks."""
    tree = ast.parse(text)
    known = set(dir(builtins)) | BUILTINS
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            known.add(node.name)
        else:
            known |= _stored(node)
    out = []
    for fn in tree.body:
        if isinstance(fn, ast.FunctionDef):
            local = known | _stored(fn) | {a.arg for a in fn.args.args}
            out += sorted({(x.lineno, fn.name, x.id) for x in ast.walk(fn) if isinstance(x, ast.Name)
                           and isinstance(x.ctx, ast.Load) and x.id not in local})
    return out


def source_of(lines, n):
    """(path, line, snippet or None) a generated line n (1-based) of lines came from, by the
    nearest `# from` comment above it; None for the header and for the comments themselves."""
    if _MARK.match(lines[n - 1]):
        return None
    for k in range(n - 1, 0, -1):
        m = _MARK.match(lines[k - 1])
        if m:
            return m.group(1), int(m.group(2)) + (n - k - 1), m.group(3)
    return None


def target(name):
    return OUT / ("viper_%s.py" % name)


def stale():
    """The generated modules whose text on disk differs from what the sources give."""
    snippets = load_snippets()
    return [target(n) for n in MODULES
            if not target(n).exists() or target(n).read_text() != generate(n, snippets)]


def _where_cmd(spec):
    path, _, n = spec.rpartition(":")
    if not path or not n.isdigit():
        raise SystemExit("--where takes FILE:LINE, got %r" % spec)
    lines = Path(path).read_text().splitlines()
    if not 1 <= int(n) <= len(lines):
        raise SystemExit("%s has %d lines, asked for line %s" % (path, len(lines), n))
    got = source_of(lines, int(n))
    if got is None:
        raise SystemExit("%s:%s is a generated comment or the header, not a source line" % (path, n))
    print("%s:%d%s" % (got[0], got[1], " (snippet %s)" % got[2] if got[2] else ""))
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="only report modules that are not current")
    ap.add_argument("--where", metavar="FILE:LINE", help="the source line a generated line came from")
    a = ap.parse_args(argv)
    if a.where:
        return _where_cmd(a.where)
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
