"""The REPL reads well: Session methods print one short line and return None or a small result
with a one-line repr; help() texts list every command with its arguments (they are strings, so
they survive .mpy compilation); fit says which data it trains on and why; timings come from
ticks_us; a long fit prints progress lines."""
import json
import re

import helpers

SCRIPT = helpers.script("repl_mp.py")


def _check(o):
    for key in ("evaluate_repr", "predict_repr", "drifted_repr", "fit_train_repr", "fit_user_repr"):
        r = o[key]
        assert "\n" not in r and len(r) <= 100, (key, r)
        assert not r.startswith("{") and not r.startswith("[") and not r.startswith("("), (key, r)
    assert re.fullmatch(r"<accuracy \d+\.\d% \(\d+/30\) on test>", o["evaluate_repr"]), o["evaluate_repr"]
    acc, acc2, correct, n = o["evaluate_acc"]
    assert acc == acc2 and n == 30 and abs(acc - correct / n) < 1e-6
    assert o["predict_unpacked"][1] == 3 and o["predict_unpacked"][2] is True
    assert o["predict_repr"].startswith("<" + o["predict_unpacked"][0] + " 0.")
    assert o["drifted_len"] == 30 and o["drifted_repr"].startswith("<30 (features, label) pairs")
    # one short human line per command (fit: its header, one line per epoch, the total)
    for key in ("evaluate", "predict"):
        assert len(o[key]) == 1 and len(o[key][0]) <= 120, (key, o[key])
    steps, epochs, seconds, n_epochs, last_steps, total = o["fit_fields"]
    assert epochs == n_epochs == 2 and steps == total == 2 * 8 and last_steps == 8
    assert o["fit_train_repr"].startswith("<fit on train: 16 steps, 2 epochs, loss ")
    # fit says what it trains on, and why
    assert "the checkpoint's training split (data=None: no user examples yet)" in o["fit_train"][0]
    assert re.search(r"fit on your 6 examples in .*user\.csv \(data=None picks them when there are "
                     r"any; data='train' for the pretraining split\)", o["fit_user"][0]), o["fit_user"][0]
    assert o["fit_asked"][0].startswith("fit on test, as asked: 30 examples, 1 epoch, ")
    # 6 examples and 24 training rows replayed beside them (rehearse=4), batch 16: 2 steps
    assert o["fit_user_repr"].startswith("<fit on user: 2 steps, 1 epoch, loss ")
    # timings from ticks_us: never "0.0 s", ms/step with two decimals that are not all .x0/.x5
    total_line = o["fit_train"][-1]
    m = re.fullmatch(r"fit: 16 steps in ([\d.]+) (us|ms|s) \(([\d.]+) (us|ms)/step\)", total_line)
    assert m and float(m.group(1)) > 0 and float(m.group(3)) > 0, total_line
    per_epoch = [l for l in o["fit_train"] + o["fit_user"] + o["fit_asked"] if l.startswith("epoch ")]
    ms = [re.search(r"([\d.]+) ms/step", l).group(1) for l in per_epoch]
    assert len(ms) == 4 and all(re.fullmatch(r"\d+\.\d\d", v) for v in ms), ms
    assert len(set(float(v) * 1000 % 500 for v in ms)) > 1, ms        # not in 0.5 ms quanta
    assert [v for v in o["epoch_ms"] if v != int(v)], o["epoch_ms"]     # microseconds, not whole ms
    # help: every public Session method, with its arguments
    text = "\n".join(o["session_help"])
    for name in o["methods"]:
        if name == "help":
            continue
        assert re.search(r"s\.%s\(" % name, text) or name in ("trainable_summary",), (name, text)
    assert "s.fit(epochs=10, data=None, lr=None, verbose=None, batch_size=None, micro_batch='auto')" in text
    assert o["help_ret"] and "finetune.Session(checkpoint='model.mfck'" in "\n".join(o["help"]).splitlines()[1]
    assert "s.help()" in "\n".join(o["help"])
    # progress lines within an epoch
    prog = [l for l in o["progress"] if l.strip().startswith("epoch 1/1: step")]
    assert len(prog) == o["progress_steps"] >= 8, o["progress"]


def test_repl_cpython(iris_flash, tmp_path):
    _check(json.loads(helpers.run_cpython(SCRIPT, iris_flash(tmp_path / "f")).splitlines()[-1]))


def test_repl_micropython(iris_flash, tmp_path, micropython):
    out = helpers.run_micropython(SCRIPT, iris_flash(tmp_path / "f"), heap="1M", exe=micropython)
    _check(json.loads(out.splitlines()[-1]))
