"""make deploy sends board/*.py precompiled (.mpy) to the flash root; the REPL entry points import
by name and print their help from strings (an .mpy has no docstrings); a NAME.py left by an older
deploy, which would shadow NAME.mpy, is removed when it is this checkout's source, and kept as
NAME.py.bak when it is not; the deploy says which."""
import os

import helpers
import board_link  # noqa: E402
import deploy  # noqa: E402
import vboard  # noqa: E402

MICROPYTHON = helpers.interpreter_path(helpers.interpreters()[-1])


def test_board_files_go_as_mpy(tmp_path, pretrained_iris):
    board_py = sorted(p.stem for p in board_link.board_files())
    assert {"finetune", "mf_session", "mf_examples", "mf_demo", "iris", "selftest"} <= set(board_py)
    with vboard.VirtualBoard(tmp_path / "vb", heap=helpers.board_heap(MICROPYTHON), micropython=MICROPYTHON) as b:
        (b.flash / "finetune.py").write_text("raise ImportError('an older finetune.py')\n")
        (b.flash / "mf_session.py").write_bytes(open(os.path.join(helpers.BOARD, "mf_session.py"), "rb").read())
        out = deploy.deploy(str(b.port), str(pretrained_iris[0]))
        assert "KEPT /finetune.py as /finetune.py.bak" in out, out
        assert "removed /mf_session.py: this checkout's own source" in out, out
        assert (b.flash / "finetune.py.bak").read_text() == "raise ImportError('an older finetune.py')\n"
        root = sorted(p.name for p in b.flash.iterdir())
        for name in board_py:
            assert name + ".mpy" in root and name + ".py" not in root, (name, root)
        out = board_link.mpremote(str(b.port), "exec",
                                  "import finetune\nfinetune.help()\ns = finetune.Session('model.mfck', verbose=False)\n"
                                  "s.help()\nprint('R', repr(s.evaluate(verbose=False)))\n"
                                  "print('F', finetune.__file__)", timeout=300)
    import finetune
    import mf_session
    assert finetune.HELP.splitlines()[0] in out and mf_session.SESSION_HELP.splitlines()[-1] in out, out
    assert "R <accuracy " in out and "F finetune.mpy" in out.replace("/finetune.mpy", "finetune.mpy"), out
