"""The board session is the REPL's face over lib, one class in one file: read with `ast`, the
session's modules (board/finetune.py and board/mf_*.py) reach no private name (`x._name`) of
another object, lib's included: only a method's own `self._name` is allowed; and no function
outside a class body takes a `self` or assigns (or setattr()s) the attributes of a parameter
named like a session, so no module changes the Session's fields from outside the class."""
import ast
import glob
import os

import helpers

SESSION_NAMES = ("self", "s", "session")


def session_modules():
    board = helpers.BOARD
    return [os.path.join(board, "finetune.py")] + sorted(glob.glob(os.path.join(board, "mf_*.py")))


def _methods(tree):
    # {id(function node): its first parameter's name} for functions defined directly in a class
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for f in node.body:
                if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.args.args:
                    out[id(f)] = f.args.args[0].arg
    return out


def private_uses(source, where):
    """'file:line expr' for each `x._name` (or getattr(x, '_name'), hasattr, setattr) where x is
    not the `self` of the method it is in, and each private name imported from microformer."""
    tree = ast.parse(source)
    methods = _methods(tree)
    bad = []

    def visit(node, own):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            own = methods.get(id(node), own if isinstance(node, ast.Lambda) else None)
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "microformer":
            for a in node.names:
                if a.name.startswith("_"):
                    bad.append("%s:%d from %s import %s" % (where, node.lineno, node.module, a.name))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in ("getattr", "hasattr", "setattr", "delattr") and len(node.args) > 1 and \
                isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str) and \
                node.args[1].value.startswith("_") and not node.args[1].value.startswith("__") and \
                not (own and isinstance(node.args[0], ast.Name) and node.args[0].id == own):
            bad.append("%s:%d %s" % (where, node.lineno, ast.unparse(node)))
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            v = node.value
            if not (own and isinstance(v, ast.Name) and v.id == own):
                bad.append("%s:%d %s" % (where, node.lineno, ast.unparse(node)))
        for child in ast.iter_child_nodes(node):
            visit(child, own)
    visit(tree, None)
    return bad


def outside_writes(source, where):
    """'file:line ...' for each function outside a class body that takes `self`, or that assigns
    or setattr()s an attribute of a parameter named like a session (self, s, session)."""
    tree = ast.parse(source)
    methods = _methods(tree)
    bad = []
    for f in ast.walk(tree):
        if not isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) or id(f) in methods:
            continue
        params = [a.arg for a in f.args.args]
        if params and params[0] == "self":
            bad.append("%s:%d %s(self, ...) is a method outside its class" % (where, f.lineno, f.name))
        watched = [p for p in params if p in SESSION_NAMES]
        for node in ast.walk(f):
            targets = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr") \
                    and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id in watched:
                bad.append("%s:%d %s() changes %s" % (where, node.lineno, node.func.id, node.args[0].id))
            for t in targets:
                for a in ast.walk(t):
                    if isinstance(a, ast.Attribute) and isinstance(a.value, ast.Name) and a.value.id in watched:
                        bad.append("%s:%d %s() assigns %s" % (where, node.lineno, f.name, ast.unparse(a)))
    return bad


def test_the_session_modules_are_there():
    names = [os.path.basename(p) for p in session_modules()]
    assert "finetune.py" in names and "mf_session.py" in names and len(names) >= 6, names


def test_no_session_module_reaches_a_private_name_of_another_object():
    bad = []
    for path in session_modules():
        with open(path) as f:
            bad += private_uses(f.read(), os.path.basename(path))
    assert not bad, "private names reached from outside their object:\n" + "\n".join(bad)


def test_no_function_outside_the_session_class_changes_a_session():
    bad = []
    for path in session_modules():
        with open(path) as f:
            bad += outside_writes(f.read(), os.path.basename(path))
    assert not bad, "functions outside a class that change a session:\n" + "\n".join(bad)


# The checks themselves, on the shape the session had when its commands were functions in
# another module taking the session as `self` (what they must catch) and on what is allowed.
SPLIT_CLASS = '''
import mf_session
from microformer import guard as _g

def parts(self, verbose=None):
    return [p.name for p in self._parts]

def save(s, path):
    s._dirty = False
    s.meta["n"] = 1
    setattr(s, "lr", 0.1)

def rehearse(s):
    return s._raw("train"), _g._check("fit", "x", 1, 0, 2)

class Session:
    def fit(self):
        self._fits += 1
        f = lambda: setattr(self, "_dirty", True)
        return self._trainer.optimizer, f

    def peek(self, other):
        return other._fits

from microformer.checkpoint import _replace, load

def capture(session, label):
    return getattr(session, "_check_label", None), getattr(session, "task", None)
'''


def test_the_checks_catch_a_class_split_across_files():
    priv = private_uses(SPLIT_CLASS, "x.py")
    assert ["x.py:6 self._parts", "x.py:9 s._dirty", "x.py:14 s._raw", "x.py:14 _g._check",
            "x.py:23 other._fits", "x.py:25 from microformer.checkpoint import _replace",
            "x.py:28 getattr(session, '_check_label', None)"] == priv, priv
    writes = outside_writes(SPLIT_CLASS, "x.py")
    assert any("parts(self, ...)" in w for w in writes), writes
    assert any("assigns s._dirty" in w for w in writes), writes
    assert any("assigns s.meta" in w for w in writes), writes
    assert any("setattr() changes s" in w for w in writes), writes
    assert len(writes) == 4, writes
