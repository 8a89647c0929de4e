"""The kernel table (lib/microformer/kernel_table.py) against every backend's source: each kernel
it names is defined by the portable kernels, the NumPy kernels, the viper module its viper column
names (or by no viper module when it says portable) and the C module when its native column says
C, with the table's arguments, names and order (viper sources are read with ast: they import only
under MicroPython; the C source by its registrations and argument counts). Every kernel a layer
calls through backend.K is in the table. The comparisons are functions run here on the real
sources and on copies with a kernel deleted or an argument added, so a mismatch is seen failing;
set_backend refuses a module that does not match, naming the kernel, the backend and the
numbers."""
import ast
import inspect
import os
import re
import types

import pytest

import helpers
from microformer import backend, kernel_table, kernels, kernels_numpy

LIB = os.path.join(helpers.ROOT, "lib", "microformer")
NATIVE_C = os.path.join(helpers.ROOT, "host", "native", "mf_native.c")
ROWS = kernel_table.rows()
TABLE = {name: (viper, native, args) for name, viper, native, args in ROWS}


def _read(name):
    with open(os.path.join(LIB, name)) as f:
        return f.read()


def python_signatures(source):
    """{name: (argument names)} of the public functions of a kernel module's source."""
    out = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            out[node.name] = tuple(a.arg for a in node.args.args)
    return out


def viper_signatures(source):
    """{name: (argument names)} of a generated viper module: its functions, and module-level
    aliases `name = _function` (a viper kernel bound under its public name)."""
    defs, out = {}, {}
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            defs[node.name] = tuple(a.arg for a in node.args.args)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            out[node.name] = defs[node.name]
        elif (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
              and isinstance(node.value, ast.Name) and node.value.id in defs):
            out[node.targets[0].id] = defs[node.value.id]
    return out


def native_signatures(source):
    """{name: number of arguments} of the C module: the names it registers (REG(MP_QSTR_name, fn))
    and the count each kernel function checks first (nargs(..., N, KN), or the count its own
    check reports: bad(self, KN, MP_QSTR_arguments, N, ...) where a trailing argument may be left out)."""
    bodies = dict(re.findall(r"KERNEL\((\w+)\)\s*\{(.*?)\n\}", source, re.S))
    out = {}
    for name, fn in re.findall(r"REG\(MP_QSTR_(\w+),\s*(\w+)\)", source):
        m = re.search(r"nargs\(self, n_args, n_kw, (\d+), KN\)|bad\(self, KN, MP_QSTR_arguments, (\d+),",
                      bodies.get(fn, ""))
        out[name] = int(m.group(1) or m.group(2)) if m else None
    return out


def mismatches(backend_name, sigs, names=None):
    """What differs between the table and a backend's {name: arguments} (names: the kernels the
    table gives this backend; default every kernel): missing kernels, other arguments, and for a
    backend restricted to some kernels, table-portable kernels it defines anyway."""
    names = set(TABLE) if names is None else set(names)
    out = []
    for name in sorted(names):
        args = TABLE[name][2]
        if name not in sigs:
            out.append("%s lacks %s(%s)" % (backend_name, name, ", ".join(args)))
        elif isinstance(sigs[name], int) or sigs[name] is None:
            if sigs[name] != len(args):
                out.append("%s: %s takes %s arguments, the table says %d" % (backend_name, name, sigs[name], len(args)))
        elif sigs[name] != args:
            out.append("%s: %s(%s), the table says (%s)" % (backend_name, name, ", ".join(sigs[name]), ", ".join(args)))
    return out


def viper_mismatches(sources):
    """The table's viper column against {module: source} of the generated viper modules."""
    out = []
    found = {}
    for mod, src in sorted(sources.items()):
        for name, args in viper_signatures(src).items():
            if name in TABLE:
                found.setdefault(name, []).append(mod)
                where = TABLE[name][0]
                if where == "-":
                    out.append("viper_%s defines %s, which the table keeps portable on viper" % (mod, name))
                elif where == mod and args != TABLE[name][2]:
                    out.append("viper_%s: %s(%s), the table says (%s)"
                               % (mod, name, ", ".join(args), ", ".join(TABLE[name][2])))
    for name, (where, _, args) in sorted(TABLE.items()):
        if where != "-" and where not in found.get(name, ()):
            out.append("viper_%s lacks %s(%s) (the table's viper column names it)" % (where, name, ", ".join(args)))
        if where != "-" and where not in sources:
            out.append("the table names viper_%s for %s: no such generated module" % (where, name))
    return out


def _viper_sources():
    return {n[len("viper_"):-3]: _read(n) for n in sorted(os.listdir(LIB))
            if n.startswith("viper_") and n.endswith(".py")}


def test_the_table_is_well_formed():
    names = [r[0] for r in ROWS]
    assert len(names) == len(set(names)), "a kernel listed twice"
    viper_modules = set(_viper_sources())
    for name, viper, native, args in ROWS:
        assert viper == "-" or viper in viper_modules, (name, viper)
        assert native in ("C", "-"), (name, native)
        assert args and len(args) == len(set(args)), (name, args)
        assert args[0] not in ("B", "N", "n", "C"), "%s: outputs first, sizes last" % name


def test_columns_are_named():
    assert list(kernel_table.kernels("viper", "rows")) == ["argmax", "gather_rows"]
    with pytest.raises(ValueError, match="column must be 'viper', 'native' or None, got 'vipr'"):
        list(kernel_table.kernels("vipr", "-"))


def test_portable_kernels_match_the_table():
    assert mismatches("python", python_signatures(_read("kernels.py"))) == []
    extra = sorted(set(python_signatures(_read("kernels.py"))) - set(TABLE))
    assert extra == [], "kernels.py defines kernels the table does not name: %s" % extra


def test_numpy_kernels_match_the_table():
    assert mismatches("numpy", python_signatures(_read("kernels_numpy.py"))) == []
    extra = sorted(set(python_signatures(_read("kernels_numpy.py"))) - set(TABLE))
    assert extra == [], "kernels_numpy.py defines kernels the table does not name: %s" % extra


def test_viper_kernels_match_the_table():
    assert viper_mismatches(_viper_sources()) == []


def test_native_kernels_match_the_table():
    with open(NATIVE_C) as f:
        sigs = native_signatures(f.read())
    in_c = [n for n, (_, native, _) in TABLE.items() if native == "C"]
    assert mismatches("native", sigs, in_c) == []
    extra = sorted(set(sigs) - set(in_c))
    assert extra == [], "mf_native.c registers kernels the table does not put in C: %s" % extra


def test_the_imported_modules_agree_with_their_sources():
    # what the comparisons above read from the sources is what CPython imports
    for mod in (kernels, kernels_numpy):
        for name, (_, _, args) in TABLE.items():
            assert tuple(inspect.signature(getattr(mod, name)).parameters) == args, (mod.__name__, name)


def test_every_kernel_a_layer_calls_is_in_the_table():
    used = set()
    for d in (LIB, os.path.join(helpers.ROOT, "board")):
        for n in os.listdir(d):
            if n.endswith(".py"):
                with open(os.path.join(d, n)) as f:
                    used |= set(re.findall(r"\bK\.([a-z_0-9]+)\(", f.read()))
    assert used, "no backend.K calls found: the pattern is stale"
    assert sorted(used - set(TABLE)) == []


# ---- the comparisons fail on a broken source -------------------------------------------------

def _drop_function(source, name):
    tree = ast.parse(source)
    tree.body = [n for n in tree.body if not (isinstance(n, ast.FunctionDef) and n.name == name)
                 and not (isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == name)]
    return ast.unparse(tree)


def _add_argument(source, name):
    return re.sub(r"(def %s\()" % name, r"\1extra, ", source, count=1)


@pytest.mark.parametrize("module", ["kernels.py", "kernels_numpy.py"])
def test_a_python_backend_missing_a_kernel_or_with_another_argument_is_reported(module):
    src = _read(module)
    assert mismatches("x", python_signatures(_drop_function(src, "layernorm_backward"))) == [
        "x lacks layernorm_backward(dinp, dout, inp, ln, N, C)"]
    assert mismatches("x", python_signatures(_add_argument(src, "avgpool1d_forward"))) == [
        "x: avgpool1d_forward(extra, out, inp, pool), the table says (out, inp, pool)"]


def test_a_viper_module_missing_a_kernel_or_with_another_argument_is_reported():
    src = _viper_sources()
    dropped = dict(src, optim=_drop_function(src["optim"], "adam_step"))
    assert viper_mismatches(dropped) == [
        "viper_optim lacks adam_step(newp, news, params, olds, hyper) (the table's viper column names it)"]
    # an alias (first_nonfinite = _first_nonfinite) counts as its function's signature
    widened = dict(src, elementwise=_add_argument(src["elementwise"], "_first_nonfinite"))
    assert viper_mismatches(widened) == ["viper_elementwise: first_nonfinite(extra, buf, n), the table says (buf, n)"]
    shadow = dict(src, rows=src["rows"] + "\n\ndef mse(dpred, pred, target, N):\n    pass\n")
    assert viper_mismatches(shadow) == ["viper_rows defines mse, which the table keeps portable on viper"]


def test_a_native_module_missing_a_kernel_or_with_another_count_is_reported():
    with open(NATIVE_C) as f:
        src = f.read()
    in_c = [n for n, (_, native, _) in TABLE.items() if native == "C"]
    gone = src.replace("    REG(MP_QSTR_gather_rows, k_gather_rows);\n", "")
    assert mismatches("native", native_signatures(gone), in_c) == ["native lacks gather_rows(dst, src, idx, start, B, F)"]
    body = re.search(r"KERNEL\(k_add_forward\)\s*\{.*?nargs\(self, n_args, n_kw, (\d+), KN\)", src, re.S)
    wider = src[:body.start(1)] + "5" + src[body.end(1):]
    assert mismatches("native", native_signatures(wider), in_c) == [
        "native: add_forward takes 5 arguments, the table says 4"]


# ---- set_backend checks at once ---------------------------------------------------------------

def _fake(drop=None, widen=None):
    m = types.ModuleType("fake_kernels")
    for name in TABLE:
        if name != drop:
            setattr(m, name, getattr(kernels, name))
    if widen:
        exec("def %s(%s, extra): pass" % (widen, ", ".join(TABLE[widen][2])), m.__dict__)
    return m


def test_check_names_the_kernel_the_backend_and_the_numbers():
    kernel_table.check(kernels, "python")
    kernel_table.check(kernels_numpy, "numpy")
    with pytest.raises(kernel_table.KernelTableError,
                       match=r"the numpy backend \(fake_kernels\) lacks the kernel argmax\(buf, off, n\)"):
        kernel_table.check(_fake(drop="argmax"), "numpy")
    with pytest.raises(kernel_table.KernelTableError,
                       match=r"zero of the python backend takes 3 arguments, expected 2 \(buf, n\)"):
        kernel_table.check(_fake(widen="zero"), "python")
    # a check restricted to some kernels (a viper module as it loads) looks at those only
    kernel_table.check(_fake(drop="argmax"), "viper", ["zero", "copy"])


def _install(monkeypatch, fake):
    import sys
    import microformer
    monkeypatch.setitem(sys.modules, "microformer.kernels_numpy", fake)
    monkeypatch.setattr(microformer, "kernels_numpy", fake)


def test_set_backend_refuses_a_module_that_does_not_match(monkeypatch):
    before = (backend.K, backend.name, backend.why)
    _install(monkeypatch, _fake(drop="copy"))
    with pytest.raises(kernel_table.KernelTableError, match="lacks the kernel copy"):
        backend.set_backend("numpy")
    assert (backend.K, backend.name, backend.why) == before     # nothing changed
    _install(monkeypatch, _fake(widen="add_forward"))
    with pytest.raises(kernel_table.KernelTableError, match="add_forward of the numpy backend takes 5 arguments, expected 4"):
        backend.set_backend("numpy")
    assert (backend.K, backend.name, backend.why) == before


def test_the_backends_lists_come_from_the_table():
    # kernels_viper and kernels_native (MicroPython only) take their lists from the table, not
    # from lists of their own: their sources name no kernel
    for module in ("kernels_viper.py", "kernels_native.py"):
        src = _read(module)
        code = "\n".join(l for l in src.splitlines() if not l.lstrip().startswith("#"))
        named = sorted(n for n in TABLE if re.search(r"[\"']%s[\"']" % n, code))
        assert named == [], "%s names kernels itself: %s" % (module, named)
        assert 'sibling("kernel_table")' in code, module
