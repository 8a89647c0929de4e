"""`make bench` ends with the speed goals against the figures of the same run (host/bench/bench_goals.py):
each goal met or missed by its own comparison, a goal the run did not measure said as such, and
the sustained-rate section's result turned into those figures (host/bench/sustained.goals)."""
import contextlib
import io

import helpers  # noqa: F401  (host/ is on the path)
import bench_common as bench
import bench_goals
import sustained as bench_sustained
import perfpage


def _goal(key):
    return [g for g in bench_goals.GOALS if g[0] == key][0]


def test_each_goal_is_met_or_missed_by_its_own_direction():
    for key, what, goal, op, _ in bench_goals.GOALS:
        step = goal * 0.01 if goal else 1
        better, worse = (goal - step, goal + step) if op == "<=" else (goal + step, goal - step)
        assert bench_goals.rows({key: better})[[g[0] for g in bench_goals.GOALS].index(key)][3] == "met", key
        assert bench_goals.rows({key: goal})[[g[0] for g in bench_goals.GOALS].index(key)][3] == "met", key
        assert bench_goals.rows({key: worse})[[g[0] for g in bench_goals.GOALS].index(key)][3] == "missed", key


def test_a_goal_without_a_figure_says_why():
    key = _goal("adam_stock")[0]
    rows = dict((r[0], r) for r in bench_goals.rows({key: "valgrind is not installed"}))
    mine = rows[_goal("adam_stock")[1]]
    assert "valgrind is not installed" in mine[2] and mine[3] not in ("met", "missed")
    others = [r for r in bench_goals.rows({}) if r[0] != mine[0]]
    assert len(others) == len(bench_goals.GOALS) - 1
    assert all("not measured" in r[2] and r[3] not in ("met", "missed") for r in others)


def test_the_sustained_section_gives_the_decode_and_instruction_figures():
    col, sus = 4000.0, 3300.0
    ran = {"rates": {"decode": (col, sus, 120, None), "fit": (1.0, 1.0, 0, None)},
           "instructions": {("iris", "512K"): 3.0 * bench_sustained.SEED["iris"],
                            ("block", "64M"): 2.5 * bench_sustained.SEED["block"]}}
    got = bench_sustained.goals(ran)
    assert got["decode_sustained"] == sus / col and got["decode_512k"] == 1
    assert abs(got["iris_x"] - 3.0) < 1e-9 and abs(got["block_x"] - 2.5) < 1e-9
    oom = {"rates": {"decode": (None, None, None, "out of memory (cmd)"), "fit": (1.0, 1.0, 0, None)},
           "instructions": None}
    got = bench_sustained.goals(oom)
    assert got["decode_512k"] == 0 and "out of memory" in got["decode_sustained"]
    assert "valgrind" in got["iris_x"] and "valgrind" in got["block_x"]
    rows = dict((r[0], r) for r in bench_goals.rows(got))
    assert rows[_goal("decode_512k")[1]][3] == "missed"


def test_the_table_lands_on_the_performance_page_as_a_table():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        bench_goals.table({"numpy_x": 1.1, "session_kb": 300})
    page = perfpage.render("STAMP date=d ; commit=c ; command=host/bench/bench_all.py ; cpython=3\n" + out.getvalue())
    lines = [x for x in page.splitlines() if x.startswith("| ")]
    assert len(lines) == 1 + len(bench_goals.GOALS)
    numpy_line = [x for x in lines if x.startswith("| " + _goal("numpy_x")[1])][0]
    assert "x1.10" in numpy_line and numpy_line.endswith("| met |")
    session_line = [x for x in lines if x.startswith("| " + _goal("session_kb")[1])][0]
    assert "| 300 |" in session_line and session_line.endswith("| missed |")


def test_a_failed_run_gives_no_instruction_count(monkeypatch, capsys):
    """A run that fails (the E=64 block does not fit a 512K heap) is no count: callgrind still
    counts its instructions, and a difference of two failed runs would be a made-up figure."""
    import subprocess

    runs = {}

    def fake(cmd, env, timeout, cwd=None):
        return 1000, runs["r"]
    monkeypatch.setattr(bench, "callgrind", fake)
    runs["r"] = subprocess.CompletedProcess([], 1, "", "MemoryError: memory allocation failed")
    assert bench._callgrind_ir("block", "viper", 1, "512K") is None
    assert "out of memory" in capsys.readouterr().out
    runs["r"] = subprocess.CompletedProcess([], 0, "warming up\n", "")
    assert bench._callgrind_ir("block", "viper", 1, "512K") is None
    runs["r"] = subprocess.CompletedProcess([], 0, "RESULT block viper 1 1 1 1 1 0 0 1\n", "")
    assert bench._callgrind_ir("block", "viper", 1, "512K") == 1000
