# mf_demo.py: the drift demo for board/finetune.py: demo(), the whole story in the demo's own
# folder, and demo_session(); the drifting sensor itself is mf_drift.py.
import os

from mf_examples import exists
from mf_session import CHECKPOINT, FIT_EPOCHS, Result, Session
from microformer.train import duration

DEMO_DIR = "demo"                   # demo()'s own folder: the user's files stay untouched
DEMO_PRETRAINED = "pretrained.mfck"     # in DEMO_DIR: where every demo run starts (make demo puts it)

FREEZE = ("attention", "head")      # what the demo freezes: the drift is absorbed by the embedding


def _join(root, p):
    if not root or p.startswith("/"):
        return p
    return root.rstrip("/") + "/" + p


def _copy(src, dst):
    buf = bytearray(512)
    mv = memoryview(buf)
    with open(src, "rb") as f, open(dst, "wb") as g:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            g.write(mv[:n])


def demo_session(fresh=True, root=None, verbose=True):
    """A Session on the demo's own files in DEMO_DIR: its checkpoint and its examples.

    fresh=True starts over: DEMO_DIR/model.mfck becomes a copy of DEMO_DIR/pretrained.mfck (what
    `make demo` copies there; without it, of the main checkpoint, which is only read) and the
    demo's own examples are dropped. The base data (data/<meta['data']>: data/iris.csv) is
    shared and only read. Nothing outside DEMO_DIR is written.
    """
    d = _join(root, DEMO_DIR)
    ck = d + "/" + CHECKPOINT
    user = d + "/user.csv"
    if fresh:
        if not exists(d):
            os.mkdir(d)
        src = d + "/" + DEMO_PRETRAINED
        if not exists(src):
            src = _join(root, CHECKPOINT)
            if not exists(src):
                raise OSError(2, "demo: no checkpoint to start from: neither %s/%s nor %s (`make "
                              "demo` or `make deploy` copies one)" % (d, DEMO_PRETRAINED, src))
        _copy(src, ck)
        if exists(user):
            os.remove(user)                  # the demo's own examples from its previous run
    # relative to root, so the base data the checkpoint names (data/iris.csv) is root's too
    return Session(checkpoint=DEMO_DIR + "/" + CHECKPOINT, user_data=DEMO_DIR + "/user.csv", root=root,
                   verbose=verbose)


def demo(root=None, n=24, epochs=FIT_EPOCHS, seed=0):
    """The drift story in one call, in the demo's own folder (DEMO_DIR; your checkpoint and
    examples are not touched): before, add drifted examples, fit, after, save, reload."""
    s = demo_session(root=root)
    held = s.drifted_examples(part="test")
    before = s.evaluate(held)["accuracy"]
    s.add_examples(s.drifted_examples(n, seed=seed))
    s.freeze(*FREEZE)
    seconds = s.fit(epochs=epochs).seconds          # ticks_us
    after = s.evaluate(held)["accuracy"]
    s.save()
    s2 = demo_session(fresh=False, root=root, verbose=False)
    again = s2.evaluate(held, verbose=False)["accuracy"]
    print("drift demo: accuracy %.1f%% before, %.1f%% after %d epochs on %d examples (%s); "
          "reloaded: %.1f%%" % (100 * before, 100 * after, epochs, n, duration(1000 * seconds), 100 * again))
    return Result("<drift demo: %.1f%% -> %.1f%%>" % (100 * before, 100 * after),
                  {"before": before, "after": after, "reloaded": again, "seconds": seconds,
                   "base_test": s2.evaluate("test", verbose=False)["accuracy"]})
