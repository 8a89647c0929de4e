# Examples from a sensor (board/mf_capture.py) and the user data file's appends (board/mf_examples.py,
# written by board/mf_exfile.py):
# a simulated sensor (a list iterator) feeds capture; every bad reading, a read() that fails,
# Ctrl-C and a failed write leave data/user.csv byte for byte as it was.
# Runs under CPython and MicroPython:
#   MICROPYPATH=lib:board:board/demos:board/benchmarks:tests/mp micropython tests/mp/capture_mp.py FLASH_DIR OUT.json
import json
import os
import sys

import mf_capture
import mf_exfile
import trust_data_mp
from trust_data_mp import err, read


class Sensor:
    """read() returns the next reading of a list; counts the calls; raises `fail` at call `at`."""

    def __init__(self, readings, at=-1, fail=None):
        self.readings = readings
        self.calls = 0
        self.at = at
        self.fail = fail

    def read(self):
        i = self.calls
        self.calls += 1
        if i == self.at:
            raise self.fail
        return self.readings[i % len(self.readings)]


class WindowSession:
    """What capture needs of a window model's Session ([L, C] = [5, 3]): it records add_examples."""

    def __init__(self):
        self.meta = {"input_shape": [5, 3]}
        self.features = ["ax", "ay", "az"]
        self.task = "classify"
        self.classes = ["wave", "rest"]
        self.targets = []
        self.verbose = False
        self.added = []

    def add_examples(self, pairs):
        self.added.extend(pairs)
        return len(self.added)


class FailingFile:
    """A file whose write() writes the first half of what it is given, then raises `fail`."""

    def __init__(self, f, fail):
        self.f = f
        self.fail = fail

    def write(self, data):
        self.f.write(data[:len(data) // 2])
        raise self.fail

    def close(self):
        self.f.close()

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()


def failing_open(fail):
    real = open

    def fake(path, mode="r"):
        f = real(path, mode)
        return FailingFile(f, fail) if "w" in mode or "a" in mode else f
    return fake


def run(root):
    r = {}
    finetune = trust_data_mp.make_flash(root)
    user = root + "/data/user.csv"
    s = finetune.Session(root=root, verbose=False)

    # ---- a flat model: one reading of F features is one example
    sensor = Sensor([[5.1, 3.5, 1.4, 0.2], [6.0, 2.9, 4.5, 1.5]])
    got = mf_capture.capture(s, sensor.read, "setosa", count=2, rate_hz=200)
    r["flat_pairs"] = [[list(x), y] for x, y in got]
    r["flat_file"] = read(user)
    r["flat_examples"] = s.num_examples()
    r["flat_reloaded"] = finetune.Session(root=root, verbose=False).num_examples()
    r["flat_calls"] = sensor.calls
    r["flat_n_wrong"] = err(lambda: mf_capture.capture(s, sensor.read, "setosa", n=3))

    # ---- a window model: L readings of C channels, time-major, at rate_hz
    w = WindowSession()
    sensor = Sensor([[float(i), 10.0 + i, 20.0 + i] for i in range(5)])
    t0 = mf_capture._now_us()
    mf_capture.capture(w, sensor.read, "wave", rate_hz=50, count=2)
    r["window_seconds"] = mf_capture._diff_us(mf_capture._now_us(), t0) / 1000000
    r["window_added"] = [[list(x), y] for x, y in w.added]
    one = Sensor([7.0])                                    # a 1-channel model takes bare numbers
    w1 = WindowSession()
    w1.meta = {"input_shape": [3, 1]}
    w1.features = ["mic"]
    mf_capture.capture(w1, one.read, "rest", rate_hz=1000)
    r["window_1ch"] = [list(x) for x, _ in w1.added]

    # ---- refusals: nothing written, and a bad label or argument before any reading
    before = read(user)
    n0 = s.num_examples()
    nan = float("nan")
    cases = {
        "short": (Sensor([[1.0, 2.0, 3.0]]), "setosa", {}),
        "text": (Sensor([[1.0, "2", 3.0, 4.0]]), "setosa", {}),
        "bool": (Sensor([[1.0, 2.0, True, 4.0]]), "setosa", {}),
        "number": (Sensor([5.0]), "setosa", {}),
        "nan": (Sensor([[5.0, 3.0, 1.0, 0.2], [5.0, nan, 1.0, 0.2]]), "setosa", {"count": 3}),
        "inf": (Sensor([[5.0, 3.0, 1.0, 0.2], [5.0, 3.0, 1e39, 0.2]]), "setosa", {"count": 2}),
        "label": (Sensor([[5.0, 3.0, 1.0, 0.2]]), "daisy", {}),
        "count": (Sensor([[5.0, 3.0, 1.0, 0.2]]), "setosa", {"count": 0}),
        "rate": (Sensor([[5.0, 3.0, 1.0, 0.2]]), "setosa", {"rate_hz": 0}),
        "read_fails": (Sensor([[5.0, 3.0, 1.0, 0.2]], 2, OSError(19, "ENODEV: no IMU at 0x68")),
                       "setosa", {"count": 3}),
    }
    for tag, (sensor, label, kw) in cases.items():
        r["refused_" + tag] = err(lambda: mf_capture.capture(s, sensor.read, label, **kw))
        r["refused_" + tag + "_calls"] = sensor.calls
    r["window_bad"] = err(lambda: mf_capture.capture(w, Sensor([[1.0, 2.0]]).read, "wave"))
    r["not_callable"] = err(lambda: mf_capture.capture(s, [1, 2], "setosa"))
    # Ctrl-C during the capture (here: in read(), the 3rd reading of 3 examples)
    sensor = Sensor([[5.0, 3.0, 1.0, 0.2]], 2, KeyboardInterrupt())
    try:
        mf_capture.capture(s, sensor.read, "setosa", count=3)
        r["ctrl_c"] = "no interrupt"
    except KeyboardInterrupt:
        r["ctrl_c"] = "KeyboardInterrupt"
    r["unchanged_after_refusals"] = read(user) == before and s.num_examples() == n0

    # ---- appends: a missing final newline is added, never merged
    with open(user, "a") as f:
        f.write("6.3,3.3,6.0,2.5,virginica")               # edited by hand: no final newline
    s = finetune.Session(root=root, verbose=False)
    n = s.num_examples()
    s.add_example([4.9, 3.0, 1.4, 0.2], "setosa")
    r["repaired_tail"] = read(user).split("\n")[-3:]
    r["repaired_count"] = [n, s.num_examples(), finetune.Session(root=root, verbose=False).num_examples()]

    # ---- appends are all or nothing: a write that fails half way (a full flash, Ctrl-C)
    before = read(user)
    n0 = s.num_examples()
    for tag, fail in (("enospc", OSError(28)), ("ctrl_c", KeyboardInterrupt())):
        mf_exfile.open = failing_open(fail)
        try:
            r["write_" + tag] = err(s.add_examples, [([5.0, 3.0, 1.0, 0.2], 0), ([6.0, 3.0, 4.0, 1.2], 1)])
        except KeyboardInterrupt:
            r["write_" + tag] = "KeyboardInterrupt"
        finally:
            del mf_exfile.open
        r["write_" + tag + "_unchanged"] = read(user) == before and s.num_examples() == n0
        r["write_" + tag + "_tmp"] = read(user + ".tmp")
    # a new file that fails: no file at all afterwards
    t = finetune.Session(root=root, user_data="data/new.csv", verbose=False)
    mf_exfile.open = failing_open(OSError(28))
    try:
        r["write_new"] = err(t.add_example, [5.0, 3.0, 1.0, 0.2], 0)
    finally:
        del mf_exfile.open
    r["write_new_file"] = [read(root + "/data/new.csv"), read(root + "/data/new.csv.tmp")]
    # the same NaN refusal in the store itself
    r["store_nan"] = err(s._examples.append, [([5.0, nan, 1.0, 0.2], 0)])

    # ---- a lone complete .tmp (a power cut between unlink and rename) is taken back
    os.rename(user, user + ".tmp")
    r["recovered"] = finetune.Session(root=root, verbose=False).num_examples()
    r["recovered_files"] = [read(user) is not None, read(user + ".tmp") is None]
    # ... an incomplete one is not
    with open(root + "/data/cut.csv.tmp", "w") as f:
        f.write("sepal_length,sepal_width,petal_length,petal_width,label\n5.0,3.0,1.")
    r["cut"] = finetune.Session(root=root, user_data="data/cut.csv", verbose=False).num_examples()
    r["cut_files"] = [read(root + "/data/cut.csv"), read(root + "/data/cut.csv.tmp") is not None]
    return r


if __name__ == "__main__":
    res = run(sys.argv[1])
    with open(sys.argv[2], "w") as f:
        f.write(json.dumps(res))
