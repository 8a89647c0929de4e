# Checkpoints on a board's filesystems inside MicroPython: littlefs v2 (the ESP32 default),
# littlefs v1 and FAT, each on a RAM block device; a save renames over an existing file. Run:
#   MICROPYPATH=lib:tests micropython tests/checkpoint_vfs_mp.py
# prints "<fs> ok" per filesystem, raises AssertionError on a failure.
import os
import vfs

from microformer import checkpoint as ck
from checkpoint_mp import build, snap
from trust_saves_mp import RAMBlockDev


for kind, cls, blocks in (("lfs2", vfs.VfsLfs2, 64), ("lfs1", vfs.VfsLfs1, 64), ("fat", vfs.VfsFat, 128)):
    bdev = RAMBlockDev(512, blocks)
    cls.mkfs(bdev)
    mnt = "/" + kind
    vfs.mount(cls(bdev), mnt)
    path = mnt + "/model.mfck"
    a, b = build(3), build(4)
    ck.save(path, a, {"v": 1})
    ck.save(path, b, {"v": 2})        # rename over an existing file
    m = build(9)
    assert ck.load(path, m)["v"] == 2 and snap(m) == snap(b)
    assert sorted(os.listdir(mnt)) == ["model.mfck"], os.listdir(mnt)
    vfs.umount(mnt)
    print(kind, "ok")
