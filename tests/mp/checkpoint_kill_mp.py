# A MicroPython process that saves a checkpoint in a loop, for test_checkpoint.py to SIGKILL at
# random moments (every surviving file must be one whole save):
#   MICROPYPATH=lib:tests/mp micropython tests/mp/checkpoint_kill_mp.py PATH
# prints "ready", then saves forever; save k writes k into the first and last value of each tensor.
import sys

import microformer as mf
from microformer import checkpoint as ck


def build():
    mf.seed(1)
    return mf.Sequential([mf.Dense(128, 256), mf.Dense(256, 128), mf.Dense(128, 64)])


if __name__ == "__main__":
    m = build()
    path = sys.argv[1]
    k = 0
    print("ready")
    while True:
        k += 1
        v = float(k)
        for name, p in m.named_params():
            p.data[0] = v
            p.data[len(p.data) - 1] = v
        ck.save(path, m, {"k": k})
