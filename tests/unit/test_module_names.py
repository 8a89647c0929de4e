"""Each module name once. The suite puts lib/, board/, host/, tests/ and their subfolders on one
sys.path (tests/helpers.py; a script run inside MicroPython gets lib/, board/ and tests/mp/), so
two files of the same name would make `import NAME` pick whichever folder comes first. The
package's own modules count by their bare names too (inside lib/microformer `golden` is
microformer/golden.py): a board or host file of that name is one reader's typo away from the
other. The viper templates (host/viper/, apart from the generator itself) are read as text by
host/viper/gen_viper.py and never imported, so they are left out; the test checks that."""
import ast
import os
import sys

import helpers

SKIP = ("build", ".venv", ".git", ".pytest_cache", "__pycache__", "node_modules")
TEMPLATES = os.path.join("host", "viper")       # read as text, never imported (checked below)


def _folders():
    """Every folder of the project holding .py files (relative paths), templates aside."""
    out = []
    for top in ("lib", "board", "host", "tests"):
        for path, dirs, files in os.walk(os.path.join(helpers.ROOT, top)):
            dirs[:] = sorted(d for d in dirs if d not in SKIP)
            rel = os.path.relpath(path, helpers.ROOT)
            if any(f.endswith(".py") for f in files):
                out.append(rel)
    return out


def _modules(folders):
    """{name: [folder/name.py, ...]} over `folders`; the template folder's only module is the generator."""
    names = {}
    for rel in folders:
        for f in sorted(os.listdir(os.path.join(helpers.ROOT, rel))):
            if not f.endswith(".py") or f == "__init__.py":
                continue
            if rel == TEMPLATES and f != "gen_viper.py":
                continue
            names.setdefault(f[:-3], []).append(os.path.join(rel, f))
    return names


def duplicates(names):
    return {n: paths for n, paths in names.items() if len(paths) > 1}


def test_no_two_modules_share_a_name():
    folders = _folders()
    assert os.path.join("lib", "microformer") in folders and "board" in folders and "tests" in folders, folders
    names = _modules(folders)
    assert "finetune" in names and "tensor" in names and "helpers" in names, "the scan misses modules"
    dup = duplicates(names)
    assert not dup, "module names found more than once (rename one of each): %s" % "; ".join(
        "%s: %s" % (n, ", ".join(p)) for n, p in sorted(dup.items()))


def test_every_folder_on_the_suites_path_is_scanned():
    # what helpers puts on sys.path and a MicroPython script's path must be folders the scan covers
    scanned = {os.path.join(helpers.ROOT, f) for f in _folders()} | {helpers.LIB}
    for p in helpers.IMPORT_PATH + helpers.SCRIPT_PATH:
        assert p in scanned, "%s is on the suite's path but not scanned for duplicate names" % p


def test_no_folder_on_the_path_hides_a_module():
    # MicroPython imports a folder without __init__.py as a namespace package, ahead of a module
    # of that name in a later path entry: with board/ on the path before board/benchmarks/, a
    # folder board/bench/ made `import bench` the folder. So no subfolder of a folder on the path
    # may be named like a module imported by its bare name (the package's own modules are
    # imported as microformer.NAME, not by their bare names).
    package = os.path.join("lib", "microformer")
    bare = {n for n, paths in _modules(_folders()).items() if any(os.path.dirname(p) != package for p in paths)}
    assert "bench" in bare and "iris" in bare, "the scan misses board modules"
    hiding = []
    for top in sorted(set(helpers.IMPORT_PATH + helpers.SCRIPT_PATH)):
        for d in sorted(os.listdir(top)):
            if d in bare and os.path.isdir(os.path.join(top, d)):
                hiding.append(os.path.relpath(os.path.join(top, d), helpers.ROOT))
    assert not hiding, "folders on the import path named like a module, which MicroPython imports instead: %s" % hiding


def test_the_viper_templates_are_never_imported():
    # the reason they are left out above: their folder is on no path (deploy loads the generator by
    # its file) and no module imports a template by name
    import deploy
    assert deploy.viper_generator().MODULES
    assert helpers.VIPER_GEN not in [os.path.abspath(p) for p in sys.path], "host/viper/ is on sys.path"
    folder = os.path.join(helpers.ROOT, TEMPLATES)
    templates = {f[:-3] for f in os.listdir(folder) if f.endswith(".py") and f != "gen_viper.py"}
    assert "snippets" in templates, templates
    for rel, paths in _modules(_folders()).items():
        for path in paths:
            with open(os.path.join(helpers.ROOT, path)) as f:
                tree = ast.parse(f.read())
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    got = {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    got = {node.module.split(".")[0]}
                else:
                    continue
                assert not got & templates, "%s imports the viper template %s" % (path, got & templates)


def test_a_duplicate_is_found():
    assert duplicates({"a": ["x/a.py"], "b": ["x/b.py", "y/b.py"]}) == {"b": ["x/b.py", "y/b.py"]}


def _imports(path):
    with open(path) as f:
        tree = ast.parse(f.read())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module.split(".")[0] if node.level == 0 else "." + node.module)
    return out


def test_the_oracles_import_nothing_they_judge():
    # tests/oracles/ is the judge: written from the math, it imports neither lib/ nor the board's or
    # the host tools' modules (the standard library, NumPy and each other only)
    project = {n for n, paths in _modules(_folders()).items()
               if not any(p.startswith(os.path.join("tests", "oracles")) for p in paths)} | {"microformer"}
    files = sorted(f for f in os.listdir(helpers.ORACLES) if f.endswith(".py"))
    assert "reference.py" in files and "checkpoint_np.py" in files, files
    for f in files:
        bad = _imports(os.path.join(helpers.ORACLES, f)) & project
        assert not bad, "tests/oracles/%s imports %s: an oracle must not use what it judges" % (f, sorted(bad))
