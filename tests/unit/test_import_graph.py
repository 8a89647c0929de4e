"""No import circles among the package's modules (lib/microformer), the board's files (board/ and
its folders, imported by their bare names on a board) and the benchmarks (host/bench/):
every import counts, the ones inside functions too (a lazy import only hides a circle until the
function runs). A circle fails the test naming its modules in order."""
import ast
import os

import helpers


def _graph(folder, package):
    # {module: {module it imports}} for the .py files of `folder` (or of a list of folders whose
    # modules import each other by bare name); `package` is the dotted name a file's relative
    # imports resolve against (None: board files, imported by their bare names)
    folders = [folder] if isinstance(folder, str) else folder
    where = {f[:-3]: d for d in folders for f in os.listdir(d) if f.endswith(".py")}
    names = set(where)
    graph = {}
    for name in sorted(names):
        with open(os.path.join(where[name], name + ".py")) as f:
            tree = ast.parse(f.read())
        deps = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level == 1 and package:
                    if node.module:
                        deps.add(node.module.split(".")[0])
                    else:
                        deps.update(a.name for a in node.names)
                elif node.module and package and node.module.startswith(package + "."):
                    deps.add(node.module[len(package) + 1:].split(".")[0])
                elif node.module and not package:
                    deps.add(node.module.split(".")[0])
            elif isinstance(node, ast.Import):
                for a in node.names:
                    mod = a.name
                    if package and mod.startswith(package + "."):
                        deps.add(mod[len(package) + 1:].split(".")[0])
                    elif not package:
                        deps.add(mod.split(".")[0])
        graph[name] = {d for d in deps if d in names and d != name and d != "__init__"}
    return graph


def _cycles(graph):
    # every circle once, as a list of modules from its first (sorted) one
    found = set()
    out = []

    def walk(start, node, path):
        for d in sorted(graph[node]):
            if d == start:
                if frozenset(path) not in found:
                    found.add(frozenset(path))
                    out.append(path + [start])
            elif d not in path and d > start:
                walk(start, d, path + [d])
    for m in sorted(graph):
        walk(m, m, [m])
    return out


def test_package_has_no_import_circles():
    g = _graph(os.path.join(helpers.ROOT, "lib", "microformer"), "microformer")
    assert "checkpoint" in g and "spec" in g["checkpoint"], "the graph misses checkpoint's imports"
    assert _cycles(g) == [], "import circles: %s" % [" -> ".join(c) for c in _cycles(g)]


def test_board_files_have_no_import_circles():
    # the session, the demos and the benchmarks share a board's root folder: one graph
    g = _graph(helpers.BOARD_PATH, None)
    assert "mf_session" in g and "mf_examples" in g["mf_session"], "the graph misses mf_session's imports"
    assert "iris" in g.get("bench", ()), "the graph misses bench's imports across the board's folders"
    assert _cycles(g) == [], "import circles: %s" % [" -> ".join(c) for c in _cycles(g)]


def test_benchmarks_have_no_import_circles():
    # the benchmarks share one module (bench_common) and import each other only through it
    g = _graph(os.path.join(helpers.ROOT, "host", "bench"), None)
    assert "bench_budget" in g and "bench_common" in g["bench_budget"], "the graph misses bench_budget's imports"
    assert _cycles(g) == [], "import circles: %s" % [" -> ".join(c) for c in _cycles(g)]


def test_host_tools_have_no_import_circles():
    g = _graph(os.path.join(helpers.ROOT, "host", "tools"), None)
    assert "torch_fx" in g.get("torch_io", ()) and "vboard" in g["board_link"], "the graph misses the tools' imports"
    assert _cycles(g) == [], "import circles: %s" % [" -> ".join(c) for c in _cycles(g)]


def test_a_circle_is_found():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
