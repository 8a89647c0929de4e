# The split belongs to the model: finetune.Session takes the base data's train / test rows from
# the checkpoint's metadata ('split': the rows by number, never reshuffled), and when the
# checkpoint gives none it chooses one once and keeps it in the metadata. Under CPython and
# inside MicroPython:
#   MICROPYPATH=lib:board:board/demos:board/benchmarks:tests/mp micropython tests/mp/split_mp.py FLASH
# FLASH: an empty folder. Prints SPLIT OK or raises AssertionError (tests/mp/test_split.py).
import os
import sys

import microformer as mf

import finetune

CLASSES = ["lo", "hi"]
ROWS = 30


def write_flash(root, **meta_extra):
    try:
        os.mkdir(root + "/data")
    except OSError:
        pass
    with open(root + "/data/pts.csv", "w") as f:
        f.write("a,b,label\n")
        for i in range(ROWS):
            # row i is recognisable by its first feature: i
            f.write("%d,%d,%s\n" % (i, i % 3, CLASSES[i % 2]))
    mf.seed(1)
    model = mf.Sequential([mf.Dense(2, 4), mf.ActivationLayer("relu"), mf.Dense(4, 2)])
    meta = {"classes": CLASSES, "input_shape": [2], "features": ["a", "b"], "mean": [15.0, 1.0],
            "std": [9.0, 1.0], "data": "pts.csv"}
    meta.update(meta_extra)
    mf.save_checkpoint(root + "/model.mfck", model, meta)


def rows_of(s, which):
    # the row numbers (first raw feature) of a selection
    X, y = s._raw(which)
    return [int(round(X[k * 2])) for k in range(len(y))]


def err(fn, *a, **kw):
    try:
        fn(*a, **kw)
    except ValueError as e:
        return str(e)
    return "no error"


def run(root):
    r = {}
    # the user's own split: the test rows by number; training rows never land in 'test'
    test = [29, 3, 17, 8, 11, 0]
    write_flash(root, split={"test": test})
    s = finetune.Session(root=root, verbose=False)
    r["given_test"] = rows_of(s, "test")
    r["given_train"] = rows_of(s, "train")
    r["given_eval_n"] = s.evaluate(verbose=False)["n"]
    r["given_meta"] = s.meta.get("split")
    # the same as a train list
    train = [i for i in range(ROWS) if i not in test]
    write_flash(root, split={"train": train})
    r["train_list_test"] = rows_of(finetune.Session(root=root, verbose=False), "test")
    # none given: the board chooses once, keeps it, and a saved checkpoint gives it back
    write_flash(root)
    s = finetune.Session(root=root, verbose=False)
    r["chosen_test"] = rows_of(s, "test")
    r["chosen_meta"] = s.meta.get("split")
    s.save()
    t = finetune.Session(root=root, verbose=False)
    r["reopened_test"] = rows_of(t, "test")
    # refused: rows out of range, repeated, a wrong key, n_train that disagrees
    for key, extra in (("out_of_range", {"split": {"test": [1, 30]}}),
                       ("repeat", {"split": {"test": [1, 1]}}),
                       ("bad_key", {"split": {"val": [1]}}),
                       ("disagree", {"split": {"test": [1, 2]}, "n_train": 20})):
        write_flash(root, **extra)
        r[key] = err(finetune.Session, root=root, verbose=False)
    return r


def check(r):
    test = [29, 3, 17, 8, 11, 0]
    assert r["given_test"] == sorted(test), r["given_test"]
    assert not set(r["given_train"]) & set(test) and len(r["given_train"]) == 30 - len(test), r["given_train"]
    assert r["given_eval_n"] == len(test) and r["given_meta"] == {"test": test}, r
    assert r["train_list_test"] == sorted(test), r["train_list_test"]
    chosen = r["chosen_test"]
    assert len(chosen) == 6 and r["chosen_meta"] == {"test": sorted(chosen)}, r
    assert r["reopened_test"] == sorted(chosen), r
    assert "metadata 'split' must be row numbers below the base data's 30 rows, got 30" in r["out_of_range"], r
    assert "unique row numbers (1 repeats)" in r["repeat"], r["repeat"]
    assert "metadata 'split' must be {\"test\": [row, ...]}" in r["bad_key"], r["bad_key"]
    assert "metadata 'n_train' must be 28, as the split gives (2 of 30 rows under 'test'), or absent, got 20" \
        in r["disagree"], r["disagree"]


if __name__ == "__main__":
    check(run(sys.argv[1]))
    print("SPLIT OK")
