# host/bench/bench_goals.py: the speed goals, what this run of `make bench` measured for each, met or not.
# host/bench/bench_all.py collects the figures its sections return into a dict and calls table() last; a
# goal this run did not measure (no valgrind, no 32-bit port, no torch) says so instead of a figure.
# The seed's C++ figures are bench_sustained.SEED (shared/FACTS.md).

# key, what is measured, the goal, "<=" or ">=", the figure's format (a format string or a function)
def _yes(x):
    return "yes" if x else "no"


GOALS = (
    ("decode_sustained", "sustained decode rate / collected rate, 32-bit port, viper, 512K heap "
     "(host/bench/sustained.py)", 0.80, ">=", "{:.0%}"),
    ("decode_512k", "the decode stack runs in a 512K heap, 32-bit port", 1, ">=", _yes),
    ("iris_x", "Iris instructions per training sample / the seed's C++, 32-bit port, 512K heap "
     "(callgrind)", 8.0, "<=", "x{:.2f}"),
    ("block_x", "E=64 block instructions per training sample / the seed's C++, 32-bit port, 64M heap "
     "(callgrind)", 3.5, "<=", "x{:.2f}"),
    ("adam_stock", "Adam instructions per parameter per step, stock port (callgrind)", 300, "<=", "{:.0f}"),
    ("adam_mp32", "Adam instructions per parameter per step, 32-bit port (callgrind)", 300, "<=", "{:.0f}"),
    ("session_kb", "smallest heap (KB) for an Iris fine-tune session, 32-bit port, the modules as .mpy "
     "(as make deploy installs them)", 256, "<=", "{:.0f}"),
    ("session_kb_py", "the same with the .py sources (compiling them takes heap too)", 256, "<=", "{:.0f}"),
    ("numpy_x", "NumPy backend E=64 step time / PyTorch's, one thread", 1.2, "<=", "x{:.2f}"),
    # the native backend (the C kernels, make native; host/bench/bench_native.py): 32-bit port, x86 module
    ("iris_native_x", "native: Iris instructions per training sample / the seed's C++, 32-bit port, 512K heap "
     "(callgrind)", 2.0, "<=", "x{:.2f}"),
    ("block_native_x", "native: E=64 block instructions per training sample / the seed's C++, 32-bit port "
     "(callgrind)", 1.0, "<=", "x{:.2f}"),
    ("adam_native_mp32", "native: Adam instructions per parameter per opt.step(), Iris model (475 parameters), "
     "32-bit port (callgrind)", 40, "<=", "{:.0f}"),
    ("adam_native_mp32_big", "native: the same on a 33k-parameter model (two Dense(128, 128))", 40, "<=", "{:.1f}"),
)


def rows(measured):
    """[(what, goal text, figure text, verdict)] for each goal; measured maps a key to its figure or
    to a string that says why there is none."""
    out = []
    for key, what, goal, op, fmt in GOALS:
        got = measured.get(key)
        fmt = getattr(fmt, "format", fmt)
        goal_text = ("%s %s" % (op, fmt(goal))) if fmt is not _yes else "yes"
        if got is None:
            out.append((what, goal_text, "not measured by this run", "–"))
        elif isinstance(got, str):
            out.append((what, goal_text, "not measured: " + got, "–"))
        else:
            met = got <= goal if op == "<=" else got >= goal
            out.append((what, goal_text, fmt(got), "met" if met else "missed"))
    return out


def table(measured):
    """The goals as a Markdown table (host/results/PERFORMANCE.md keeps it as a table)."""
    print("## Speed goals", flush=True)
    print("| measured | goal | this run | |", flush=True)
    print("|---|---|---|---|", flush=True)
    for what, goal, got, verdict in rows(measured):
        print("| %s | %s | %s | %s |" % (what, goal, got, verdict), flush=True)
