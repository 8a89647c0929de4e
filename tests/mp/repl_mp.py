# What a REPL user sees from board/finetune.py, under CPython and inside MicroPython:
#   MICROPYPATH=lib:board:board/demos:board/benchmarks:tests/mp micropython tests/mp/repl_mp.py FLASH
# FLASH: a folder as `make deploy` fills it. Prints one JSON line: every result's repr, the
# lines each command printed, the help texts and the Session's public methods.
import json
import sys

import finetune
from microformer.train import fit as train_fit

out = {}
printed = []


def capture(f):
    # what f() prints, as a list of lines (print is replaced for the call)
    import builtins
    old = builtins.print
    lines = []

    def grab(*a, **k):
        lines.append(" ".join(str(x) for x in a))
    builtins.print = grab
    try:
        r = f()
    finally:
        builtins.print = old
    return r, lines


flash = sys.argv[1]
s, out["load"] = capture(lambda: finetune.Session(root=flash))
r, out["evaluate"] = capture(lambda: s.evaluate())
out["evaluate_repr"] = repr(r)
out["evaluate_acc"] = [r.accuracy, r["accuracy"], r.correct, r.n]
r, out["predict"] = capture(lambda: s.predict([5.9, 3.0, 5.1, 1.8]))
out["predict_repr"] = repr(r)
label, probs = r
out["predict_unpacked"] = [label, len(probs), r.label == label]
held, _ = capture(lambda: s.drifted_examples(part="test"))
out["drifted_repr"] = repr(held)
out["drifted_len"] = len(held)
r, out["fit_train"] = capture(lambda: s.fit(epochs=2))            # no user examples yet
out["fit_train_repr"] = repr(r)
out["epoch_ms"] = [h["ms"] for h in r]
out["fit_fields"] = [r.steps, r.epochs, r.seconds, len(r), r[-1]["steps"], sum([h["steps"] for h in r])]
capture(lambda: s.add_examples(s.drifted_examples(6)))
r, out["fit_user"] = capture(lambda: s.fit(epochs=1))              # now the user's examples
out["fit_user_repr"] = repr(r)
r, out["fit_asked"] = capture(lambda: s.fit(epochs=1, data="test"))
r, out["help"] = capture(lambda: finetune.help())
out["help_ret"] = r is None
r, out["session_help"] = capture(lambda: s.help())
out["methods"] = sorted([m for m in dir(finetune.Session) if not m.startswith("_")])
# a progress line at least every progress_s seconds within an epoch (here: every step)
ds = s._select("train", "t")[1]
import microformer as mf
h, out["progress"] = capture(lambda: train_fit(s.model, mf.CrossEntropyLoss(), mf.Adam(s.model, lr=1e-3),
                                               ds, epochs=1, batch_size=16, verbose=True, progress_s=1e-6))
out["progress_steps"] = h[-1]["steps"]
print(json.dumps(out))
