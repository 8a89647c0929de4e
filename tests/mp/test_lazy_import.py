"""microformer's lazy names (mf.Transformer, mf.load_model, any submodule): a name that is no
submodule is an AttributeError; an ImportError raised while a lazy module imports is passed on
as an ImportError whose text names the module and keeps the original message (MicroPython keeps
no chained cause, so the text is what a board user sees), on CPython and inside MicroPython."""
import json
import os
import shutil

import helpers

def _run(runner, tmp_path):
    # a package folder where microformer/pool1d.py fails to import (a name it imports is missing)

    pkg = tmp_path / "lib"
    shutil.copytree(os.path.join(helpers.ROOT, "lib", "microformer"), str(pkg / "microformer"))
    p = pkg / "microformer" / "pool1d.py"
    p.write_text("from .layer import no_such_function\n" + p.read_text())
    script = tmp_path / "lazy.py"
    script.write_text(
        "import json, sys\n"
        "sys.path.insert(0, %r)\n"
        "import microformer as mf\n"
        "out = {'has': hasattr(mf, 'no_such_name')}\n"
        "try:\n    mf.no_such_name\nexcept AttributeError as e:\n    out['missing'] = str(e)\n"
        "try:\n    mf.MaxPool1D\nexcept ImportError as e:\n    out['inner'] = str(e)\n"
        "print(json.dumps(out))\n" % str(pkg))
    return json.loads(runner(str(script)).strip().splitlines()[-1])


def _check(out):
    assert out["has"] is False
    assert out["missing"] == "module 'microformer' has no attribute 'no_such_name'"
    assert "microformer.pool1d (for microformer.MaxPool1D) failed to import" in out["inner"], out
    assert "no_such_function" in out["inner"], out


def test_cpython(tmp_path):
    _check(_run(lambda s: helpers.run_cpython(s), tmp_path))


def test_micropython(tmp_path, micropython):
    _check(_run(lambda s: helpers.run_micropython(s, exe=micropython), tmp_path))
