# Forged checkpoints for the loader tests: CRC-valid files with any tag, metadata and tensor
# table (the bytes as given, so a tag that is not UTF-8 or metadata that is not a JSON object can
# be written). Runs in CPython and MicroPython; the layout is the one in microformer/checkpoint.py.
#   craft(tag, meta, tensors) -> bytes
#     tag: str or bytes; meta: bytes (written as is) or anything json.dumps takes;
#     tensors: [(name str or bytes, shape tuple, data bytes or None for zeros)]
import json
import struct

from microformer.checkpoint import MAGIC, VERSION, crc32


def _b(s):
    return s if isinstance(s, (bytes, bytearray)) else s.encode()


def craft(tag, meta, tensors=()):
    tb = _b(tag)
    mb = meta if isinstance(meta, (bytes, bytearray)) else json.dumps(meta).encode()
    body = bytearray()
    body += struct.pack("<H", len(tb)) + tb
    body += struct.pack("<I", len(mb)) + mb
    body += struct.pack("<I", len(tensors))
    for name, shape, data in tensors:
        nb = _b(name)
        n = 1
        for d in shape:
            n *= d
        body += struct.pack("<H", len(nb)) + nb
        body += struct.pack("<B", len(shape)) + struct.pack("<%dI" % len(shape), *shape)
        body += data if data is not None else bytes(4 * n)
    size = 16 + len(body) + 4
    head = MAGIC + struct.pack("<HHI", VERSION, 0, size)
    head += struct.pack("<I", crc32(head))
    out = head + bytes(body)
    return out + struct.pack("<I", crc32(out))


def write(path, tag, meta, tensors=()):
    data = craft(tag, meta, tensors)
    with open(path, "wb") as f:
        f.write(data)
    return len(data)
