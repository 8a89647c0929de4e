# SIGKILL during saves on a FAT or littlefs image (a block device backed by a host file, so
# every block written before the kill is kept), for test_checkpoint_states.py:
#   MICROPYPATH=lib:tests/mp micropython tests/mp/checkpoint_kill_vfs_mp.py mkfs  fat|lfs2 IMAGE
#   MICROPYPATH=lib:tests/mp micropython tests/mp/checkpoint_kill_vfs_mp.py loop  fat|lfs2 IMAGE RUN
#   MICROPYPATH=lib:tests/mp micropython tests/mp/checkpoint_kill_vfs_mp.py check fat|lfs2 IMAGE
# loop saves once, prints "ready", and saves forever (save k of run r writes 1000 r + k into the first and
# last value of each tensor and {"k": 1000 r + k} into the metadata); check prints a JSON line:
# the files, and the k of the checkpoint that loads (or the error).
import json
import os
import sys
import vfs

import microformer as mf
from microformer import checkpoint as ck

BLOCK = 512
BLOCKS = {"fat": 2048, "lfs2": 128}     # FAT leaks the clusters of a file killed mid-write
KINDS = {"fat": vfs.VfsFat, "lfs2": vfs.VfsLfs2}


class FileBlockDev:
    """Blocks in a host file; each write goes to the OS before writeblocks returns."""

    def __init__(self, path, blocks):
        self.f = open(path, "r+b")
        self.blocks = blocks

    def readblocks(self, n, buf, off=0):
        self.f.seek(n * BLOCK + off)
        self.f.readinto(buf)

    def writeblocks(self, n, buf, off=None):
        self.f.seek(n * BLOCK + (off or 0))
        self.f.write(buf)
        self.f.flush()

    def ioctl(self, op, arg):
        if op == 4:
            return self.blocks
        if op == 5:
            return BLOCK
        if op in (1, 2, 3, 6):
            return 0


def build():
    mf.seed(1)
    return mf.Sequential([mf.Dense(32, 64), mf.Dense(64, 32)])      # a 16.7 KB checkpoint


def mount(kind, image):
    bdev = FileBlockDev(image, BLOCKS[kind])
    vfs.mount(KINDS[kind](bdev), "/img")
    return "/img/m.mfck"


if __name__ == "__main__":
    mode, kind, image = sys.argv[1], sys.argv[2], sys.argv[3]
    if mode == "mkfs":
        with open(image, "wb") as f:
            f.write(bytes(BLOCK * BLOCKS[kind]))
        KINDS[kind].mkfs(FileBlockDev(image, BLOCKS[kind]))
    elif mode == "loop":
        path = mount(kind, image)
        m = build()
        base = 1000 * int(sys.argv[4])
        k = 0
        while True:
            k += 1
            v = float(base + k)
            for name, p in m.named_params():
                p.data[0] = v
                p.data[len(p.data) - 1] = v
            ck.save(path, m, {"k": base + k})
            if k == 1:
                print("ready")      # one whole save in this run: the kill lands in a later one
    else:
        path = mount(kind, image)
        out = {"files": sorted(os.listdir("/img"))}
        m = build()
        try:
            k = ck.load(path, m)["k"]
            whole = True
            for name, p in m.named_params():
                whole = whole and p.data[0] == k and p.data[len(p.data) - 1] == k
            out["k"] = k
            out["whole"] = whole
        except Exception as e:
            out["error"] = "%s: %s" % (type(e).__name__, e)
        print(json.dumps(out))
