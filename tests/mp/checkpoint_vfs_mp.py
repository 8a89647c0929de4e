# Checkpoints on a board's filesystems inside MicroPython: littlefs v2 (the ESP32 default),
# littlefs v1 and FAT, each on a RAM block device. Run:
#   MICROPYPATH=lib:tests/mp micropython tests/mp/checkpoint_vfs_mp.py [STEP]
# prints "<fs> ok" per filesystem, then per filesystem "<fs> states TRIED HELD" (every state an
# interrupted save can leave, a save cut short after every STEP-th byte or run to the end:
# checkpoint_states_mp.walk) and "<fs> full TRIED HELD" (the same states on a volume too full for
# the new save); raises AssertionError on a failure.
import os
import sys
import vfs

from microformer import checkpoint as ck
from checkpoint_mp import build, snap
import checkpoint_states_mp as cs
from trust_saves_mp import RAMBlockDev, big

FILESYSTEMS = (("lfs2", vfs.VfsLfs2, 64), ("lfs1", vfs.VfsLfs1, 64), ("fat", vfs.VfsFat, 128))


def mount(kind, cls, blocks):
    bdev = RAMBlockDev(512, blocks)
    cls.mkfs(bdev)
    mnt = "/" + kind
    vfs.mount(cls(bdev), mnt)
    return mnt


def renames(kind, cls, blocks):
    mnt = mount(kind, cls, blocks)
    path = mnt + "/model.mfck"
    a, b = build(3), build(4)
    ck.save(path, a, {"v": 1})
    ck.save(path, b, {"v": 2})        # rename over an existing file
    m = build(9)
    assert ck.load(path, m)["v"] == 2 and snap(m) == snap(b)
    assert sorted(os.listdir(mnt)) == ["model.mfck"], os.listdir(mnt)
    vfs.umount(mnt)
    print(kind, "ok")


def full(kind, cls, blocks):
    """Each state on a volume with too little room for a 16 KB save: refused with 'no space left'
    naming the file, the previous checkpoint loads, nothing of the attempt is left."""
    tried = held = 0
    new = big(4)
    for name, main, t, survivor in cs.STATES:
        mnt = mount(kind, cls, blocks)
        path = mnt + "/m.mfck"
        old, older = cs.model(3), cs.model(4)
        img = {"old": cs.image(old, path, "old"), "older": cs.image(older, path, "older")}
        img["half"] = img["old"][:len(img["old"]) // 2]
        img["empty"] = b""
        fl = bytearray(img["old"])
        fl[len(fl) // 2] ^= 0x10
        img["flipped"] = bytes(fl)
        img[None] = None
        cs.put(path, img[main])
        cs.put(path + ".tmp", img[t])
        with open(mnt + "/filler.bin", "wb") as f:
            while os.statvfs(mnt)[3] > 6:
                f.write(bytes(512))
                f.flush()
        tried += 1
        try:
            ck.save(path, new, {"v": "new"})
            err = "saved"
        except OSError as e:
            err = str(e)
        ok = "no space left" in err and path in err
        if survivor is not None:
            ok = ok and cs._load(path) == snap(old) and not cs.exists(path + ".tmp")
        if not ok:
            print("FAIL", kind, name, err, os.listdir(mnt))
        held += ok
        vfs.umount(mnt)
    return tried, held


if __name__ == "__main__":
    step = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    for fs in FILESYSTEMS:
        renames(*fs)
    for fs in FILESYSTEMS:
        mnt = mount(*fs)
        tried, held = cs.walk(mnt, step)
        print(fs[0], "states", tried, held)
        vfs.umount(mnt)
        tried, held = full(*fs)
        print(fs[0], "full", tried, held)
