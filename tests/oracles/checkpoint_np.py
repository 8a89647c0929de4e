# tests/oracles/checkpoint_np.py: the microformer checkpoint format (MFCK v1 and v2) with NumPy, written from the
# byte layout documented in lib/microformer/checkpoint.py without importing lib/.
#
#   python tests/oracles/checkpoint_np.py info FILE      # header, metadata and every tensor
#
# Layout (little-endian): "MFCK" u16 version=1 u16 flags=0 u32 file_size u32 crc32(bytes 0..11)
# | u16 T, tag | u32 M, meta JSON | u32 N | N x (u16 L, name, u8 R, R x u32 dims, float32 data)
# | u32 crc32 of everything before it.
# Version 2 (a model with int8 weights): each record has u8 dtype after its dims: 0 = float32
# data as above, 1 = int8 rows of a matrix (R = 2): prod(dims) int8 q, then dims[0] float32
# scales; the weight is q * scale. read() returns int8 tensors dequantized, read_int8() as (q, scale).
import json
import os
import struct
import sys
import zlib

import numpy as np

MAGIC = b"MFCK"
VERSION = 1
VERSION_INT8 = 2


def write(path, tensors, tag, meta=None):
    """tensors: dict name -> array (saved as float32, C order, in dict order).

    As the board's writer: metadata must be JSON with finite floats (MicroPython's json cannot
    read inf or nan), checked before PATH is touched; the file is written to PATH.tmp, then
    renamed over PATH. Any float32 bit pattern is written as given (the format tests use inf and
    NaN payloads); microformer.checkpoint.save is the one that refuses non-finite weights.
    """
    path = os.fspath(path)
    body = bytearray()
    tb = tag.encode("utf-8")
    try:
        mb = json.dumps({} if meta is None else meta, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as e:
        raise ValueError("checkpoint_np.write: metadata must be JSON with finite floats: %s (meta %r)"
                         % (e, meta))
    body += struct.pack("<H", len(tb)) + tb
    body += struct.pack("<I", len(mb)) + mb
    body += struct.pack("<I", len(tensors))
    for name, a in tensors.items():
        a = np.ascontiguousarray(np.asarray(a, dtype="<f4"))
        if a.ndim < 1:
            a = a.reshape(1)
        nb = name.encode("utf-8")
        body += struct.pack("<H", len(nb)) + nb
        body += struct.pack("<B", a.ndim) + struct.pack("<%dI" % a.ndim, *a.shape)
        body += a.tobytes()
    size = 16 + len(body) + 4
    head = MAGIC + struct.pack("<HHI", VERSION, 0, size)
    head += struct.pack("<I", zlib.crc32(head))
    data = head + bytes(body)
    data += struct.pack("<I", zlib.crc32(data))
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return size


def read(path):
    """(tag, meta, {name: float32 ndarray}), int8 tensors as q * scale; ValueError on any damage."""
    tag, meta, out = read_int8(path)
    for name, a in out.items():
        if isinstance(a, tuple):
            q, scale = a
            out[name] = (q.astype(np.float32) * scale[:, None]).astype(np.float32)
    return tag, meta, out


def read_int8(path):
    """(tag, meta, {name: float32 ndarray, or (int8 q [out, in], float32 scale [out]) for an int8 tensor})."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != MAGIC:
        raise ValueError("%s: not a microformer checkpoint" % path)
    if len(data) < 16:
        raise ValueError("%s: truncated header" % path)
    version, flags, size, hcrc = struct.unpack_from("<HHII", data, 4)
    if zlib.crc32(data[:12]) != hcrc:
        raise ValueError("%s: bad header CRC" % path)
    if version not in (VERSION, VERSION_INT8):
        raise ValueError("%s: unsupported version %d" % (path, version))
    if len(data) != size:
        raise ValueError("%s: truncated or padded: expected %d bytes, got %d" % (path, size, len(data)))
    (crc,) = struct.unpack_from("<I", data, size - 4)
    if zlib.crc32(data[:size - 4]) != crc:
        raise ValueError("%s: bad CRC" % path)
    pos = 16
    (t,) = struct.unpack_from("<H", data, pos)
    tag = data[pos + 2:pos + 2 + t].decode("utf-8")
    pos += 2 + t
    (m,) = struct.unpack_from("<I", data, pos)
    meta = json.loads(data[pos + 4:pos + 4 + m].decode("utf-8"))
    pos += 4 + m
    (n,) = struct.unpack_from("<I", data, pos)
    pos += 4
    out = {}
    for _ in range(n):
        (L,) = struct.unpack_from("<H", data, pos)
        name = data[pos + 2:pos + 2 + L].decode("utf-8")
        pos += 2 + L
        r = data[pos]
        shape = struct.unpack_from("<%dI" % r, data, pos + 1)
        pos += 1 + 4 * r
        dtype = 0
        if version == VERSION_INT8:
            dtype = data[pos]
            pos += 1
        count = int(np.prod(shape))
        if dtype == 0:
            out[name] = np.frombuffer(data, dtype="<f4", count=count, offset=pos).reshape(shape).copy()
            pos += 4 * count
        elif dtype == 1 and r == 2:
            q = np.frombuffer(data, dtype=np.int8, count=count, offset=pos).reshape(shape).copy()
            scale = np.frombuffer(data, dtype="<f4", count=shape[0], offset=pos + count).copy()
            out[name] = (q, scale)
            pos += count + 4 * shape[0]
        else:
            raise ValueError("%s: tensor %r has dtype %d with shape %r (known: 0 float32, 1 int8 rows)"
                             % (path, name, dtype, tuple(shape)))
    if pos != size - 4:
        raise ValueError("%s: malformed (%d stray bytes)" % (path, size - 4 - pos))
    return tag, meta, out


def main(argv):
    if len(argv) != 3 or argv[1] != "info":
        print("usage: python tests/oracles/checkpoint_np.py info FILE")
        return 2
    tag, meta, tensors = read(argv[2])
    print("tag:  %s" % tag)
    print("meta: %s" % json.dumps(meta))
    total = 0
    for name, a in tensors.items():
        total += a.size
        print("  %-12s %-10s mean %+.4f  std %.4f  min %+.4f  max %+.4f"
              % (name, "x".join(map(str, a.shape)), a.mean(), a.std(), a.min(), a.max()))
    print("%d tensors, %d floats" % (len(tensors), total))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
