"""The seed's Iris example trains to the seed's accuracy under CPython and under MicroPython."""
import json

import helpers
from iris_seed_mp import SEED_TEST, SEED_TRAIN


def test_iris_cpython_and_micropython_match_the_seed(micropython):
    import iris
    cp = iris.main(epochs=100, verbose=False)
    out = helpers.run_micropython(helpers.script("iris_run_mp.py"), "python", exe=micropython)
    mp = json.loads(out.strip().splitlines()[-1])
    for r in (cp, mp):
        assert r["train_acc"] >= SEED_TRAIN - 1e-9, r
        assert r["test_acc"] >= SEED_TEST - 1e-9, r
    assert cp["n_test"] == mp["n_test"] > 0
    assert abs(cp["test_acc"] - mp["test_acc"]) <= 1 / cp["n_test"] + 1e-9      # one example at most
    assert abs(cp["final_loss"] - mp["final_loss"]) < 1e-3
