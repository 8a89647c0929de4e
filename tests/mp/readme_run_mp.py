# The steps of a README REPL transcript, run as the REPL runs them, in CPython, MicroPython or on a
# board: tests/board/test_readme.py appends `run([...])` with the `>>> ` sources and splits the output.
MARK = "--- readme step %d ---"


def run(steps):
    g = {"__name__": "__main__"}
    for i, src in enumerate(steps):
        print(MARK % i)
        try:
            code = compile(src, "<README step %d>" % i, "eval")
        except SyntaxError:             # a statement: run it; an expression: echo its repr, as >>> does
            exec(compile(src, "<README step %d>" % i, "exec"), g)
            continue
        value = eval(code, g)
        if value is not None:
            print(repr(value))
