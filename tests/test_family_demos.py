"""The sequence demos inside MicroPython: digits (rows as tokens through an EncoderBlock) and the
causal character model generating through the KV cache. Also a quick CPython smoke run of each."""
import json
import os
import sys

import helpers

BOARD = os.path.join(helpers.ROOT, "board")

MP_SCRIPT = """
import json, sys
sys.path.insert(0, sys.argv[1])
import digits, charlm
d = digits.main(epochs=6, backend="viper", verbose=False)
c = charlm.main(steps=150, backend="viper", verbose=False)
keep = lambda r, ks: dict((k, r[k]) for k in ks)
print("RESULT " + json.dumps([keep(d, ("train_acc", "test_acc", "n_train", "n_test", "s_per_epoch")),
                              keep(c, ("test_acc", "tokens_per_s", "tokens_per_s_recompute", "sample",
                                       "kv_bytes_per_token"))]))
"""


def test_demos_micropython(tmp_path, micropython):
    script = tmp_path / "demos.py"
    script.write_text(MP_SCRIPT)
    out = helpers.run_micropython(str(script), BOARD, heap="8M", exe=micropython)
    line = [l for l in out.splitlines() if l.startswith("RESULT ")][-1]
    d, c = json.loads(line[7:])
    assert (d["n_train"], d["n_test"]) == (500, 300)
    assert d["test_acc"] >= 0.75, d              # 10 classes: chance is 0.10
    assert c["test_acc"] >= 0.5, c               # next character; chance ~ 1/20
    assert c["sample"].startswith("the dog ") and len(c["sample"]) == 32
    assert c["tokens_per_s"] > c["tokens_per_s_recompute"] > 0
    assert c["kv_bytes_per_token"] == 2 * 4 * 24


def test_demos_cpython_smoke():
    if BOARD not in sys.path:
        sys.path.insert(0, BOARD)
    import charlm
    import digits
    r = digits.main(epochs=1, verbose=False, n_train=32, n_test=16)
    assert 0.0 <= r["test_acc"] <= 1.0 and len(r["history"]) == 1
    lines = digits.show_attention(r["model"], [8] * 64)
    assert len(lines) == 8 and all(len(l) == 8 for l in lines)
    c = charlm.main(steps=3, verbose=False)
    assert c["sample"].startswith("the dog ")
    assert c["model"].named_params()[0][0] == "0.W"
