# The board session's loaders: an adapter after an unsaved fit, user data with an invalid UTF-8
# byte or too big for the heap, a missing data file. Every refusal leaves the session as it was
# and names the file (and the line). Runs under CPython and MicroPython:
#   MICROPYPATH=lib:board:board/demos:board/benchmarks:tests/mp micropython tests/mp/trust_session_mp.py FOLDER OUT.json [BIG]
# (FOLDER: an empty folder; BIG: also a user.csv of 10 MB, for a heap it cannot fit in).
import json
import os
import sys

from microformer import checkpoint

import trust_loaders_mp as tl

PAIRS = [([0.1, 0.2, 0.3, 0.4, 0.5, 0.6], "wave"), ([0.6, 0.5, 0.4, 0.3, 0.2, 0.1], "tap"),
         ([1.0, 0.0, 1.0, 0.0, 1.0, 0.0], "shake"), ([0.0, 0.0, 0.0, 0.0, 0.0, 0.0], "rest")]
HEADER = "ax,ay,az,gx,gy,gz,label\n"


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def flash(root):
    try:
        os.mkdir(root + "/data")
    except OSError:
        pass
    checkpoint.save(root + "/gesture.mfck", tl.model(), tl.META)


def run(root, big):
    import finetune
    r = {}
    flash(root)
    S = finetune.Session
    # an adapter for gesture.mfck
    s = S("gesture.mfck", root=root, verbose=False)
    s.lora(rank=2, targets="attention")
    s.fit(epochs=1, data=PAIRS, verbose=False)
    s.save_adapter("g.adapter.mfck")
    # a refused adapter leaves the session able to save (its spec still describes the model)
    def extra(recs):
        recs.append(["9.lora_A", [2, 8], 0, bytearray(64)])
    tl.forge(root + "/g.adapter.mfck", root + "/bad.adapter.mfck", None, extra)
    s = S("gesture.mfck", root=root, verbose=False)
    r["adapter_bad"] = tl.err(s.load_adapter, "bad.adapter.mfck")
    r["adapter_bad_session"] = tl.err(S, "gesture.mfck", None, "data/user.csv", 0.01, 16, root, None,
                                      False, "bad.adapter.mfck")
    # 5. load_adapter after an unsaved fit: refused, the fitted weights kept
    s2 = S("gesture.mfck", root=root, verbose=False)
    s2.fit(epochs=2, data=PAIRS, verbose=False, lr=0.05)
    before = tl.state(s2.model)
    r["adapter_after_fit"] = tl.err(s2.load_adapter, "g.adapter.mfck")
    r["adapter_after_fit_same"] = tl.state(s2.model) == before
    r["adapter_bad_save"] = tl.err(s.save, "other.mfck")
    # 12. an invalid UTF-8 byte on line 3 of user.csv
    user = root + "/data/user.csv"
    write(user, (HEADER + "0.1,0.2,0.3,0.4,0.5,0.6,wave\n").encode() + b"0.1,0.2,0.3,0.4,0.5,0.6,t\xffp\n")
    r["user_utf8"] = tl.err(S, "gesture.mfck", None, "data/user.csv", 0.01, 16, root, None, False)
    os.remove(user)
    # 16. read_csv of a missing file names it
    from microformer import data
    r["read_csv_missing"] = tl.err(data.read_csv, root + "/data/nope.csv")
    # 13. user.csv of 10 MB on a small heap: the MemoryError names the data file
    if big:
        row = b"0.123456,0.234567,0.345678,0.456789,0.567891,0.678912,shake\n"
        with open(user, "wb") as f:
            f.write(HEADER.encode())
            chunk = row * 100
            for _ in range(10 * 1024 * 1024 // len(chunk)):
                f.write(chunk)
        r["user_big"] = tl.err(S, "gesture.mfck", None, "data/user.csv", 0.01, 16, root, None, False)
        os.remove(user)
    return r


if __name__ == "__main__":
    out = run(sys.argv[1], len(sys.argv) > 3)
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)
    print("TRUST SESSION DONE")
