# Checkpoints on a board's filesystems inside MicroPython: littlefs v2 (the ESP32 default),
# littlefs v1 and FAT, each on a RAM block device; a save renames over an existing file. Run:
#   MICROPYPATH=lib:tests micropython tests/checkpoint_vfs_mp.py
# prints "<fs> ok" per filesystem, raises AssertionError on a failure.
import os
import vfs

from microformer import checkpoint as ck
from checkpoint_mp import build, snap


class RAMBlockDev:
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
    assert ck.load(path, m) == {"v": 2} and snap(m) == snap(b)
    assert sorted(os.listdir(mnt)) == ["model.mfck"], os.listdir(mnt)
    vfs.umount(mnt)
    print(kind, "ok")
