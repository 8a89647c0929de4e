"""The sequence demos inside MicroPython (tests/mp/demos_mp.py): digits (rows as tokens through an
EncoderBlock) and the causal character model generating through the KV cache. Also a short
CPython run of each with the same checks."""
import helpers
import demos_mp


def test_demos_micropython(micropython):
    out = helpers.run_micropython(helpers.script("demos_mp.py"), "viper", heap="8M", exe=micropython)
    assert "DEMOS OK" in out, out


def test_demos_cpython_short():
    import charlm
    import digits
    r = digits.main(epochs=1, verbose=False, n_train=32, n_test=16)
    demos_mp.check_digits(r, 32, 16)
    assert len(r["history"]) == 1
    lines = digits.show_attention(r["model"], [8] * 64)
    assert len(lines) == 8 and all(len(l) == 8 for l in lines)
    c = charlm.main(steps=3, verbose=False)
    demos_mp.check_charlm(c)
    assert c["model"].named_params()[0][0] == "0.W"
