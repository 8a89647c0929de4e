# Checkpoint saves that must not make things worse, inside MicroPython (also runs on a board:
# `import trust_saves_mp; trust_saves_mp.main()` with the package in /lib).
# Prints one JSON line per case with what was observed; tests/mp/test_trust_saves.py judges them.
import json
import os
import sys

import microformer as mf
from microformer import checkpoint as ck

try:
    import vfs
except ImportError:
    vfs = None


class RAMBlockDev:
    """A block device in RAM (the extended interface littlefs needs)."""

    def __init__(self, block_size, num_blocks):
        self.block_size = block_size
        self.data = bytearray(block_size * num_blocks)

    def readblocks(self, n, buf, off=0):
        a = n * self.block_size + off
        buf[:] = self.data[a:a + len(buf)]

    def writeblocks(self, n, buf, off=None):
        a = n * self.block_size + (off or 0)
        self.data[a:a + len(buf)] = buf

    def ioctl(self, op, arg):
        if op == 4:
            return len(self.data) // self.block_size
        if op == 5:
            return self.block_size
        if op == 6:
            return 0


def small(seed):
    mf.seed(seed)
    return mf.Sequential([mf.Dense(4, 16), mf.ActivationLayer("relu"), mf.Reshape((4, 4)),
                          mf.Attention(4, 2), mf.GlobalAvgPool(), mf.Dense(4, 3)])


def big(seed):
    mf.seed(seed)
    return mf.Sequential([mf.Dense(32, 128), mf.Dense(128, 32)])     # ~ 33 KB


def snap(m):
    return [bytes(p.data) for n, p in m.named_params()]


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def free_bytes(mnt):
    st = os.statvfs(mnt)
    return st[0] * st[3]


def attempt(fn):
    """(exception type name, errno or None, message) of fn(), or (None, None, None)."""
    try:
        fn()
    except Exception as e:
        return type(e).__name__, (e.args[0] if isinstance(e, OSError) and e.args else None), str(e)
    return None, None, None


def report(case, **kw):
    kw["case"] = case
    print(json.dumps(kw))


def refusals(d):
    """Bad metadata, non-finite weights, a directory: refused, old file byte-identical, no .tmp."""
    path = d + "/m.mfck"
    good = small(3)
    ck.save(path, good, {"v": "old"})
    before = read_bytes(path)

    def check(case, fn):
        exc, err, msg = attempt(fn)
        m = small(9)
        report(case, exc=exc, msg=msg, same=read_bytes(path) == before,
               tmp=(path + ".tmp") in [d + "/" + n for n in os.listdir(d)],
               loads=ck.load(path, m)["v"] == "old" and snap(m) == snap(good))

    check("meta_inf", lambda: ck.save(path, small(4), {"best_loss": float("inf")}))
    check("meta_nan_nested", lambda: ck.save(path, small(4), {"hist": [{"loss": 1.0}, {"loss": float("nan")}]}))
    check("meta_not_json", lambda: ck.save(path, small(4), {"f": small}))
    bad = small(4)
    named = bad.named_params()
    named[2][1].data[5] = float("nan")
    check("weight_nan", lambda: ck.save(path, bad, {"v": "new"}))
    named[2][1].data[5] = 0.5
    named[-1][1].data[2] = float("inf")
    check("weight_inf", lambda: ck.save(path, bad, {"v": "new"}))
    report("weight_names", names=[named[2][0], named[-1][0]])
    os.mkdir(d + "/adir")
    exc, err, msg = attempt(lambda: ck.save(d + "/adir", small(4), {}))
    report("directory", exc=exc, msg=msg, listing=sorted(os.listdir(d)))
    exc, err, msg = attempt(lambda: ck.load(d + "/nope.mfck", small(4)))
    report("missing_load", exc=exc, errno=err, msg=msg)
    exc, err, msg = attempt(lambda: ck.read_header(d + "/nope.mfck"))
    report("missing_header", exc=exc, errno=err, msg=msg)


def full_volume(kind, cls, blocks):
    """A save that does not fit: refused by the volume, space given back, user.csv still grows."""
    bdev = RAMBlockDev(512, blocks)
    cls.mkfs(bdev)
    mnt = "/" + kind
    vfs.mount(cls(bdev), mnt)
    path = mnt + "/iris.mfck"
    old = small(3)
    ck.save(path, old, {"v": "old"})
    with open(mnt + "/user.csv", "w") as f:
        f.write("a,b,c,d,label\n")
    # fill the volume until a big checkpoint cannot fit, leaving a few blocks free
    with open(mnt + "/filler.bin", "wb") as f:
        chunk = bytes(512)
        while free_bytes(mnt) > 8 * 512:
            f.write(chunk)
            f.flush()
    free0 = free_bytes(mnt)
    files0 = sorted(os.listdir(mnt))
    exc, err, msg = attempt(lambda: ck.save(path, big(4), {"v": "big"}))
    free1 = free_bytes(mnt)
    files1 = sorted(os.listdir(mnt))
    m = small(9)
    loads = ck.load(path, m)["v"] == "old" and snap(m) == snap(old)
    def append():
        with open(mnt + "/user.csv", "a") as f:
            f.write("5.1,3.5,1.4,0.2,setosa\n")
    app = attempt(append)
    with open(mnt + "/user.csv") as f:
        user = f.read()
    # a save that fits still works (replacing the old file on a nearly full volume)
    newer = small(5)
    ok = attempt(lambda: ck.save(path, newer, {"v": "newer"}))
    m2 = small(9)
    loads2 = ck.load(path, m2)["v"] == "newer" and snap(m2) == snap(newer)
    report("full_" + kind, exc=exc, errno=err, msg=msg, free0=free0, free1=free1, files0=files0,
           files1=files1, loads=loads, append=app[0], user=user, save_after=ok[0], loads_after=loads2,
           files2=sorted(os.listdir(mnt)))
    vfs.umount(mnt)


def main(d):
    refusals(d)
    for kind, cls, blocks in (("fat", vfs.VfsFat, 160), ("lfs2", vfs.VfsLfs2, 96)):
        full_volume(kind, cls, blocks)


if __name__ == "__main__":
    main(sys.argv[1])
