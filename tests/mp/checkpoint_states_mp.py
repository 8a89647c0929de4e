# The states an interrupted save can leave next to a checkpoint PATH, and a walk that starts a
# save from each of them and cuts it short after every byte (as a full volume or a power cut
# would) or lets it finish; after each, a loadable checkpoint must remain: the previous one (a
# failed save) or the new one (a save that returned). Runs in CPython and in MicroPython, on the
# host filesystem and on FAT / littlefs images (test_checkpoint_states.py, checkpoint_vfs_mp.py).
import os

import microformer as mf
from microformer import checkpoint as ck


def model(seed):
    mf.seed(seed)
    return mf.Sequential([mf.Dense(3, 4), mf.ActivationLayer("relu"), mf.Dense(4, 2)])


def snap(m):
    return [bytes(p.data) for _, p in m.named_params()]


def image(m, where, v):
    """The bytes of a complete checkpoint of m (saved at `where`, read back, removed)."""
    ck.save(where, m, {"v": v})
    with open(where, "rb") as f:
        data = f.read()
    os.remove(where)
    return data


class PowerCut(Exception):
    pass


class Cut:
    """A file that takes n bytes and then fails: errno 28 (a full volume: save cleans up) or a
    power cut (`crash`: the exception save does not know, the bytes written stay)."""

    def __init__(self, f, n, crash):
        self.f, self.n, self.crash = f, n, crash

    def write(self, b):
        b = bytes(b)
        if len(b) > self.n:
            self.f.write(b[:self.n])
            self.f.close()
            if self.crash:
                raise PowerCut()
            raise OSError(28)
        self.n -= len(b)
        return self.f.write(b)

    def flush(self):
        self.f.flush()

    def close(self):
        self.f.close()

    def fileno(self):
        raise AttributeError


def exists(p):
    try:
        os.stat(p)
        return True
    except OSError:
        return False


def put(p, data):
    if data is None:
        if exists(p):
            os.remove(p)
        return
    with open(p, "wb") as f:
        f.write(data)


# state: (PATH holds, PATH.tmp holds, which copy must survive a failed save) with
# 'old' / 'older': complete checkpoints; 'half' / 'empty' / 'flipped': damaged ones
STATES = (
    ("main", "old", None, "old"),
    ("main+complete_tmp", "old", "older", "old"),
    ("main+half_tmp", "old", "half", "old"),
    ("main+empty_tmp", "old", "empty", "old"),
    ("lone_complete_tmp", None, "old", "old"),
    ("lone_half_tmp", None, "half", None),
    ("lone_empty_tmp", None, "empty", None),
    ("nothing", None, None, None),
    ("flipped_main+complete_tmp", "flipped", "old", "old"),
)


def walk(d, step=1, log=print):
    """Every state x every cut (0..size-1, by `step`) x (full volume, power cut), then a whole
    save; returns (cases tried, cases where a loadable checkpoint remained as required)."""
    path = d + "/m.mfck"
    tmp = path + ".tmp"
    old, older, new = model(3), model(4), model(5)
    img = {"old": image(old, path, "old"), "older": image(older, path, "older")}
    img["half"] = img["old"][:len(img["old"]) // 2]
    img["empty"] = b""
    fl = bytearray(img["old"])
    fl[len(fl) // 2] ^= 0x10
    img["flipped"] = bytes(fl)
    img[None] = None
    size = len(image(new, path, "new"))
    want = {"old": snap(old)}
    tried = held = 0
    cuts = list(range(0, size, step)) + [None]      # None: the save runs to the end
    for name, main, t, survivor in STATES:
        for crash in (False, True):
            for n in cuts:
                if n is None and crash:
                    continue
                put(path, img[main])
                put(tmp, img[t])
                tried += 1
                if n is not None:
                    ck._open = lambda p, mode, n=n, crash=crash: Cut(open(p, mode), n, crash) \
                        if mode == "wb" else open(p, mode)
                try:
                    ck.save(path, new, {"v": "new"})
                    err = None
                except (OSError, PowerCut) as e:
                    err = e
                finally:
                    ck._open = open
                ok = _check(path, tmp, n, crash, err, survivor, want, snap(new), name, log)
                held += ok
    return tried, held


def _check(path, tmp, n, crash, err, survivor, want, new, name, log):
    where = "%s cut=%s crash=%s" % (name, n, crash)
    if n is None:                       # a whole save: the new checkpoint, no .tmp
        if err is not None:
            log("FAIL %s: %r" % (where, err))
            return 0
        got = _load(path)
        if got != new or exists(tmp):
            log("FAIL %s: the new save does not load (tmp left: %s)" % (where, exists(tmp)))
            return 0
        return 1
    if err is None:
        log("FAIL %s: a cut-short save returned" % where)
        return 0
    if not crash:
        msg = str(err)
        if "no space left" not in msg or path not in msg:
            log("FAIL %s: message %r" % (where, msg))
            return 0
        if exists(tmp):                  # a failed save removes its own partial bytes
            log("FAIL %s: %s left behind" % (where, tmp))
            return 0
    if survivor is None:
        return 1                         # there was no good copy to keep
    got = _load(path)
    if got != want[survivor]:
        log("FAIL %s: the previous checkpoint does not load (%r)" % (where, got))
        return 0
    return 1


def _load(path):
    m = model(9)
    try:
        ck.load(path, m)
    except (OSError, ValueError) as e:
        return str(e)
    return snap(m)


if __name__ == "__main__":
    import sys
    tried, held = walk(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1)
    print("states", tried, held)
