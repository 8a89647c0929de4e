"""The seed's Iris example trains to the seed's accuracy under CPython and under MicroPython."""
import json
import os

import helpers
import iris_run  # noqa: F401  (sets up board/ on sys.path)

SEED_TRAIN, SEED_TEST = 119 / 120, 28 / 30   # tiny_ai C++: 99.17 % train, 93.33 % test


def test_iris_cpython_and_micropython_match_the_seed(micropython):
    import iris
    cp = iris.main(epochs=100, verbose=False)
    out = helpers.run_micropython(os.path.join(helpers.TESTS, "iris_run.py"), "python", exe=micropython)
    mp = json.loads(out.strip().splitlines()[-1])
    for r in (cp, mp):
        assert r["train_acc"] >= SEED_TRAIN - 1e-9, r
        assert r["test_acc"] >= SEED_TEST - 1e-9, r
    assert abs(cp["test_acc"] - mp["test_acc"]) <= 1 / 30 + 1e-9
    assert abs(cp["final_loss"] - mp["final_loss"]) < 1e-3
