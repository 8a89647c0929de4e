"""make board-report (host/tools/board_report.py): selftest, bench and a fine-tune on a board, one file.

Run against the virtual board; each fact in the report is checked against the same fact asked
another way (the interpreter itself, the package source, git)."""
import ast
import os
import subprocess

import pytest

import helpers
import board_report  # noqa: E402  (host/ is on the path: helpers)
import vboard  # noqa: E402

MICROPYTHON = helpers.interpreter_path(helpers.interpreters()[-1])


def _version():
    with open(os.path.join(helpers.ROOT, "lib", "microformer", "__init__.py")) as f:
        for node in ast.parse(f.read()).body:
            if isinstance(node, ast.Assign) and node.targets[0].id == "__version__":
                return node.value.value


@pytest.mark.board
def test_the_report_holds_what_the_board_says(tmp_path, pretrained_iris, deployed_flash):
    out = tmp_path / "report.md"
    deployed_flash(tmp_path / "vb", MICROPYTHON)       # the report's deploy then copies nothing
    with vboard.VirtualBoard(tmp_path / "vb", heap=helpers.board_heap(MICROPYTHON, 2048), micropython=MICROPYTHON) as b:
        assert board_report.main(["--port", str(b.port), "--checkpoint", pretrained_iris[0],
                                  "--out", str(out), "--epochs", "1"]) == str(out)
        flash_ck = (b.flash / "model.mfck").read_bytes()
    text = out.read_text()
    version = subprocess.run([MICROPYTHON, "-c", "import sys; print(sys.version)"],
                             capture_output=True, text=True, check=True).stdout.strip()
    assert version in text
    commit = subprocess.run(["git", "-C", helpers.ROOT, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True, check=True).stdout.strip()
    assert "| commit (host) | %s" % commit in text
    assert "| package version (host) | %s |" % _version() in text
    assert "| microformer on the board | %s heap used after import" % _version() in text
    assert "Selftest: **PASSED" in text and " 0 failed" in text and "FAIL\n" not in text
    bench_rows = [l.split() for l in text.splitlines() if l.startswith("iris ")]
    assert {r[1] for r in bench_rows} >= {"python", "viper"}, bench_rows
    ft = dict((l.split()[1], l) for l in text.splitlines() if l.startswith("FT "))
    assert set(ft) == {"before", "after", "fit"} and "accuracy" in ft["after"], ft
    with open(pretrained_iris[0], "rb") as f:
        assert f.read() == flash_ck            # the fine-tune saved nothing


def test_a_failed_selftest_says_failed():
    selftest = "viper   softmax        max err 9.00e-02  (tol 5e-03)  FAIL\nselftest: 20 passed, 1 failed\nSELFTEST False\n"
    text, ok = board_report.render("today", "p", {}, selftest, "", "", "1.0", "abc", 1)
    assert not ok and "Selftest: **FAILED (20 passed, 1 failed)**" in text
    ok_text, ok = board_report.render("today", "p", {}, "selftest: 21 passed, 0 failed\nSELFTEST True\n", "", "", "1.0", "abc", 1)
    assert ok and "Selftest: **PASSED (21 checks)**" in ok_text


def test_bad_epochs_are_refused():
    with pytest.raises(SystemExit, match="--epochs must be at least 1, got 0"):
        board_report.main(["--port", "/dev/null", "--epochs", "0"])
