# User examples per model: each checkpoint has its own user-data file (data/user.csv for the
# deployed model.mfck, data/NAME.user.csv for NAME.mfck); two models on one board each keep their
# own examples and both sessions start; a user-data file that does not fit the model is never
# offered for deletion: the error names the checkpoint it belongs to and how to open that one.
# Under CPython and inside MicroPython:
#   MICROPYPATH=lib:board:board/demos:board/benchmarks:tests/mp micropython tests/mp/user_data_mp.py FLASH
# Prints USER DATA OK or raises AssertionError (tests/mp/test_user_data.py).
import sys

import microformer as mf

import finetune
import split_mp


def write_room(root):
    # a second model on the same board: 3 features, 2 classes, no base data
    mf.seed(2)
    model = mf.Sequential([mf.Dense(3, 4), mf.ActivationLayer("relu"), mf.Dense(4, 2)])
    mf.save_checkpoint(root + "/room.mfck", model, {"classes": ["empty", "busy"], "input_shape": [3],
                                                    "features": ["co2", "temp", "noise"]})


def err(fn, *a, **kw):
    try:
        fn(*a, **kw)
    except ValueError as e:
        return str(e)
    return "no error"


def run(root):
    r = {}
    split_mp.write_flash(root)                  # model.mfck: features a, b
    write_room(root)
    a = finetune.Session(root=root, verbose=False)
    a.add_example([3, 1], "hi")
    b = finetune.Session("room.mfck", root=root, verbose=False)
    b.add_example([400, 21.5, 30], "busy")
    b.add_example([380, 20.0, 10], "empty")
    r["paths"] = (a.user_path[len(root) + 1:], b.user_path[len(root) + 1:])
    del a, b
    a = finetune.Session(root=root, verbose=False)
    b = finetune.Session("room.mfck", root=root, verbose=False)
    r["counts"] = (a.num_examples(), b.num_examples())
    # the first model's examples named for the second: refused, naming whose they are
    before = open(root + "/data/user.csv").read()
    r["foreign"] = err(finetune.Session, "room.mfck", root=root, user_data="data/user.csv", verbose=False)
    r["kept"] = open(root + "/data/user.csv").read() == before
    # a file no checkpoint here owns: said so, kept as well
    with open(root + "/data/other.csv", "w") as f:
        f.write("x,y,z,w,label\n1,2,3,4,busy\n")
    r["orphan"] = err(finetune.Session, "room.mfck", root=root, user_data="data/other.csv", verbose=False)
    return r


def check(r):
    assert r["paths"] == ("data/user.csv", "data/room.user.csv"), r["paths"]
    assert r["counts"] == (1, 2), r["counts"]
    e = r["foreign"]
    assert "data/user.csv holds another model's examples (its header has 3 fields: a,b,label" in e, e
    assert "room.mfck needs 4: co2,temp,noise,label" in e, e
    assert "they belong to model.mfck: open it with finetune.Session('model.mfck')" in e, e
    assert "user_data='data/room.user.csv'" in e and "The file is not changed" in e, e
    assert "delete" not in e.lower(), e
    assert r["kept"], r
    assert "no checkpoint on this board has that header (kept as it is)" in r["orphan"], r["orphan"]
    assert "delete" not in r["orphan"].lower(), r["orphan"]


if __name__ == "__main__":
    check(run(sys.argv[1]))
    print("USER DATA OK")
