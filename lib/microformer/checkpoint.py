# microformer.checkpoint: on-flash weights. One binary file per model, written atomically.
# Runs unchanged under CPython and MicroPython; streams the weight buffers (no big copies).
#
# Byte layout, format versions 1 and 2 (every integer unsigned little-endian):
#
#   offset  size   field
#   0       4      magic b"MFCK"
#   4       2      version = 1 (every tensor float32), or 2 (a model holding int8 weights)
#   6       2      flags = 0 (reserved)
#   8       4      file_size: total bytes of the file, trailing CRC included
#   12      4      header_crc: CRC32 of bytes 0..11 (so a damaged size field is not taken for
#                  truncation); bytes 0..15 keep this layout in every future version
#   16      2      T, then T bytes: model tag (UTF-8), an architecture fingerprint
#           4      M, then M bytes: metadata (UTF-8 JSON object, free-form)
#           4      N: number of tensors, then N records:
#                    2      L, then L bytes: tensor name (UTF-8), e.g. "3.Wq"
#                    1      R: rank (>= 1)
#                    4*R    dims, outermost first
#                    1      dtype (version 2 only; absent in version 1, where every tensor is 0):
#                             0 = float32, 1 = int8 rows with a float32 scale per row (R = 2)
#                    dtype 0: 4*prod(dims)  float32 little-endian, row-major (no padding, no alignment)
#                    dtype 1: prod(dims) int8 values q, row-major, then 4*dims[0] bytes: float32
#                             scale per row; the weight is q * scale (microformer.quant)
#   file_size-4  4  CRC32 (IEEE 802.3 / zlib.crc32) of bytes 0 .. file_size-5
#
# save() writes version 1 when every tensor is float32 (readers of version 1 keep reading such
# files) and version 2 when the model holds an int8 weight; a version-1 reader refuses those
# ("unsupported version 2"). load() reads both. A tensor stored as int8 becomes an int8 weight
# of the model (microformer.quant: frozen, as every int8 weight), after every check has passed;
# a float32 tensor for a weight the model holds as int8 is refused (quant.dequantize(model) first).
#
# The default tag is model_tag(model), e.g. "Sequential(Dense,ActivationLayer(relu),Attention)":
# layer classes only, so a model of the same kind but other sizes gets a "wrong shape" message.
#
# save() first checks everything it can without touching the disk: the metadata (JSON types
# only, every float finite: MicroPython's json cannot read back inf or nan) and every weight
# (a NaN or inf is refused, naming the tensor and the index); a path that is a directory is
# refused too. Then it writes PATH.tmp, flushes, closes, and renames it over PATH (os.replace
# on CPython, os.rename on MicroPython: VfsPosix, littlefs and FAT all replace an existing
# target; FAT does it as unlink + rename). If the rename fails, save() removes PATH and renames
# again; load() reads a complete PATH.tmp when PATH is missing.
#
# The states an interruption can leave, and what the next save() does with each before it
# writes its own PATH.tmp (so it never truncates the only copy):
#   PATH alone                          nothing to do
#   PATH + PATH.tmp (any)               PATH is the checkpoint; the .tmp (a save cut short, or
#                                       one whose rename never came) is overwritten
#   PATH.tmp alone, complete (CRC ok)   power lost between unlink and rename: renamed to PATH
#   PATH.tmp alone, damaged or empty    holds no checkpoint: overwritten
#   PATH failing its CRC + a complete PATH.tmp    the .tmp replaces PATH
# A damaged .tmp is never preferred over a good file. A save that fails with an exception (a
# full volume, Ctrl-C, a refused rename) removes only its own PATH.tmp, so a full flash has the
# free space it had before the attempt, and the error names the file: "no space left" for
# errno 28, and for errno 36 (ENAMETOOLONG), which littlefs returns when a full volume has no
# room for a new file's entry; "no such directory" for a missing folder.
#
# Paths are str; on CPython anything os.fspath accepts (pathlib.Path) works too. A missing file
# raises OSError(ENOENT) naming the path (FileNotFoundError on CPython); a directory given to a
# reader, OSError(EISDIR) naming it.
#
# load() checks magic, header CRC, version, size and the whole-file CRC (pass 1, a 512-byte
# scratch buffer), then the tag and every name, shape and dtype against the model (an int8
# record only for a Dense or attention weight matrix) and every value (pass 2: each float32
# value and int8 scale finite, as save() requires, read through a 128-float buffer), and only
# then reads the data straight into the parameter arrays with readinto (pass 3; an int8 record
# into a new int8 weight, put in its layer last). Every refusal is a CheckpointError (a
# ValueError) naming the file and what is wrong; the model is untouched.
# (Only a read error of the medium itself during pass 3, after the CRC passed, could leave a
# partial copy.) A CRC-valid file is still data from anywhere, so pass 2 also refuses: a tag,
# tensor name or metadata that is not UTF-8; metadata that is not a JSON object, or nests lists
# and objects more than MAX_META_DEPTH levels; a tensor record that runs past the end.
#
# read_header() (what load_model and a board session call before they build a model) also
# compares the model spec the metadata describes (find_spec, below) with the tensor table
# (check_tensors): the total of floats, then every name and shape, all read off the spec's
# arguments (specplan.plan; a spec may declare at most specplan.MAX_PARAMS floats), so a forged 200-byte file
# saying Dense(8192, 8192) is refused in milliseconds, before any layer is built.
import json
import os
import struct
import sys
from array import array

from .tensor import shape_size, zeros

try:
    from binascii import crc32 as _crc32_native
except ImportError:
    _crc32_native = None

MAGIC = b"MFCK"
VERSION = 1             # every tensor float32
VERSION_INT8 = 2        # with a dtype per tensor (int8 weights); this reader knows both
_F32 = 0                # dtype codes of the tensor table (version 2)
_I8 = 1
_PREFIX = 16
_CHUNK = 512
_open = open            # tests replace this to simulate a crash in the middle of a save


class CheckpointError(ValueError):
    pass


# ---- CRC32 (zlib-compatible); pure-Python fallback kept in 16-bit halves (small ints only) --

_tlo = None
_thi = None


def _make_tables():
    global _tlo, _thi
    lo = array("H", bytes(512))
    hi = array("H", bytes(512))
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0xEDB88320 if c & 1 else c >> 1
        lo[n] = c & 0xFFFF
        hi[n] = c >> 16
    _tlo, _thi = lo, hi


def crc32_py(data, crc=0):
    """CRC32 of a bytes-like `data` continuing from `crc` (pure Python, incremental)."""
    if _tlo is None:
        _make_tables()
    tlo, thi = _tlo, _thi
    crc ^= 0xFFFFFFFF
    lo = crc & 0xFFFF
    hi = crc >> 16
    for b in data:
        i = (lo ^ b) & 0xFF
        lo = ((lo >> 8) | ((hi & 0xFF) << 8)) ^ tlo[i]
        hi = (hi >> 8) ^ thi[i]
    return ((hi << 16) | lo) ^ 0xFFFFFFFF


def crc32(data, crc=0):
    """zlib-compatible CRC32 of a bytes-like or array buffer, continuing from `crc`."""
    if _crc32_native is not None:
        return _crc32_native(data, crc) & 0xFFFFFFFF
    if isinstance(data, (bytes, bytearray)):
        return crc32_py(data, crc)
    mv = memoryview(data)
    if hasattr(mv, "cast"):
        return crc32_py(mv.cast("B"), crc)
    # MicroPython without binascii.crc32: copy 128 items at a time to get at the bytes
    for i in range(0, len(mv), 128):
        crc = crc32_py(bytearray(mv[i:i + 128]), crc)
    return crc


# ---- helpers ----------------------------------------------------------------------------

def _check_byteorder():
    if sys.byteorder != "little":
        raise CheckpointError("checkpoint: float32 data is little-endian; this machine is %s-endian"
                              % sys.byteorder)


def _named(model):
    if hasattr(model, "named_params"):
        return model.named_params()
    return [(p.name, p) for p, _ in model.params()]


def model_tag(model):
    """Architecture fingerprint: the layer classes (and activation kinds) in order."""
    def one(l):
        s = type(l).__name__
        k = getattr(l, "kind", None)
        return "%s(%s)" % (s, k) if isinstance(k, str) else s
    if hasattr(model, "layers"):
        return "%s(%s)" % (type(model).__name__, ",".join(one(l) for l in model.layers))
    return one(model)


def _file_size(path):
    return os.stat(path)[6]


def _exists(path):
    try:
        os.stat(path)
        return True
    except OSError:
        return False


def _fspath(path, who):
    """A str path; on CPython also pathlib.Path and other os.PathLike objects."""
    if isinstance(path, str):
        return path
    fs = getattr(os, "fspath", None)
    if fs is not None and not isinstance(path, (bytes, bytearray)):
        try:
            path = fs(path)
        except TypeError:
            pass
        if isinstance(path, str):
            return path
    raise TypeError("%s: path must be a str%s, got %s" % (
        who, " or a pathlib.Path" if fs is not None else "", type(path).__name__))


def _resolve(path, who):
    # PATH, or a complete PATH.tmp left by a save interrupted between unlink and rename.
    path = _fspath(path, who)
    if not _exists(path):
        if _exists(path + ".tmp"):
            return path + ".tmp"
        raise OSError(2, "checkpoint %r: no such file" % path)     # 2 = ENOENT
    if _is_dir(path):
        raise OSError(21, "checkpoint %r is a directory, not a checkpoint file" % path)   # 21 = EISDIR
    return path


def _open_read(path):
    try:
        return _open(path, "rb")
    except OSError as e:
        raise OSError(_errno(e), "checkpoint %r: cannot open it (%s)" % (path, e))


def _is_dir(path):
    try:
        return os.stat(path)[0] & 0x4000 != 0
    except OSError:
        return False


def _remove_quietly(path):
    try:
        os.remove(path)
    except OSError:
        pass


def _check_meta(v, where):
    """JSON types only, str keys, every float finite; the error names where the bad value is."""
    if v is None or isinstance(v, (bool, int, str)):
        return
    if isinstance(v, float):
        if v - v != 0:              # inf - inf and nan - nan are nan, != 0
            raise ValueError("checkpoint.save: %s is %r: metadata floats must be finite (the file "
                             "could not be read back); store None or a string instead" % (where, v))
        return
    if isinstance(v, (list, tuple)):
        for i in range(len(v)):
            _check_meta(v[i], "%s[%d]" % (where, i))
        return
    if isinstance(v, dict):
        for k in v:
            if not isinstance(k, str):
                raise ValueError("checkpoint.save: %s has key %r: metadata keys must be str, got %s"
                                 % (where, k, type(k).__name__))
            _check_meta(v[k], "%s[%r]" % (where, k))
        return
    raise ValueError("checkpoint.save: %s is a %s: metadata must be JSON (dict, list, str, int, "
                     "finite float, bool, None)" % (where, type(v).__name__))


def _check_finite(named):
    """Refuse a NaN or inf weight: the saved model would be broken, and the old file is good."""
    for name, p in named:
        d = p.scale if _is_i8(p) else p.data
        for i in range(len(d)):
            v = d[i]
            if v - v != 0:
                raise ValueError("checkpoint.save: tensor %r holds %r at index %d (shape %r); "
                                 "refusing to save non-finite weights (the existing file is kept)"
                                 % (name, v, i, tuple(p.shape)))


def _is_i8(p):
    # an int8 weight (microformer.quant); by class name: no import, and no getattr default,
    # which allocates an exception per miss on MicroPython
    return p.__class__.__name__ == "Int8Weight"


def _nbytes(p):
    # bytes of a tensor's data in the file
    return p.size + 4 * p.shape[0] if _is_i8(p) else 4 * p.size


class _Writer:
    def __init__(self, f):
        self.f = f
        self.crc = 0
        self.n = 0

    def write(self, buf, width=4):
        # width: bytes per item of an array (4: 'f'; 1: 'b')
        self.crc = crc32(buf, self.crc)
        self.f.write(buf)
        self.n += len(buf) if isinstance(buf, (bytes, bytearray)) else width * len(buf)


# ---- save ---------------------------------------------------------------------------------

def _model_spec(model):
    # to_spec(model), or None when a layer is one a spec cannot describe (a class of one's own)
    from .spec import to_spec
    try:
        return to_spec(model)
    except ValueError:
        return None


def save(path, model, meta=None, tag=None, spec="auto"):
    """Write every parameter of `model` (frozen ones too) to `path`, atomically.

    meta: a JSON-serialisable dict (class names, normalisation, epoch, ...); not modified.
    tag: the model tag; default model_tag(model).
    spec: what goes into the file's meta['spec'] (microformer.spec.to_spec(model), which
      microformer.load_model(path) rebuilds the model from):
      "auto"  the model's spec when every layer can be described; a model with a layer class
              of one's own is saved WITHOUT a spec (load_model then refuses the file, saying so;
              load_checkpoint into a model built in code still works);
      True    the model's spec, and ValueError naming the layer when it cannot be described;
      False   no spec written.
    A meta['spec'] given by the caller must describe the model (else ValueError).
    """
    _check_byteorder()
    path = _fspath(path, "checkpoint.save")
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise ValueError("checkpoint.save: meta must be a dict, got %s" % type(meta).__name__)
    if spec not in ("auto", True, False):
        raise ValueError("checkpoint.save: spec must be 'auto', True or False, got %r" % (spec,))
    if spec is not False:
        if spec is True:
            from .spec import to_spec
            mine = to_spec(model)           # ValueError names the layer it cannot describe
        else:
            mine = _model_spec(model)
        if mine is not None:
            if "spec" in meta:
                from .spec import difference
                d = difference(meta["spec"], mine, ("meta['spec']", "the model"))
                if d:
                    raise ValueError("checkpoint.save: meta['spec'] does not describe the model (%s)" % d)
            meta = dict(meta)
            meta["spec"] = mine
    _check_meta(meta, "meta")
    tag_b = (model_tag(model) if tag is None else tag).encode()
    meta_b = json.dumps(meta, separators=(",", ":")).encode()     # compact: a board reads it whole
    named = _named(model)
    if len(tag_b) > 0xFFFF:
        raise ValueError("checkpoint.save: tag longer than 65535 bytes")
    size = _PREFIX + 2 + len(tag_b) + 4 + len(meta_b) + 4 + 4
    version = VERSION
    for name, p in named:
        if _is_i8(p):
            version = VERSION_INT8
    seen = {}
    for name, p in named:
        nb = name.encode()
        if name in seen:
            raise ValueError("checkpoint.save: two tensors named %r" % name)
        seen[name] = 1
        if len(nb) > 0xFFFF or not 1 <= len(p.shape) <= 255:
            raise ValueError("checkpoint.save: %r: name too long or rank %d" % (name, len(p.shape)))
        size += 2 + len(nb) + 1 + 4 * len(p.shape) + _nbytes(p) + (version != VERSION)
    _check_finite(named)
    if _is_dir(path):
        raise OSError(21, "checkpoint.save: %r is a directory" % path)     # 21 = EISDIR

    tmp = path + ".tmp"
    _promote(path, tmp)             # a complete lone PATH.tmp becomes PATH before PATH.tmp is reused
    try:
        _write(tmp, size, tag_b, meta_b, named, version)
    except OSError as e:
        _remove_quietly(tmp)        # our own partial bytes; a full volume gets its space back
        raise _save_error(e, path, tmp, size)
    except BaseException:
        _remove_quietly(tmp)
        raise
    try:
        replace_file(tmp, path)
    except OSError as e:
        if _exists(path):           # the old file is still there: drop the new copy
            _remove_quietly(tmp)
            raise OSError(_errno(e), "checkpoint.save: renaming %r to %r failed (%s); the new copy was "
                          "removed and %r is unchanged" % (tmp, path, e, path))
        raise OSError(_errno(e), "checkpoint.save: renaming %r to %r failed (%s); the new checkpoint is "
                      "%r, which load() reads while %r is missing" % (tmp, path, e, tmp, path))
    return size


def _errno(e):
    return e.args[0] if e.args and isinstance(e.args[0], int) else 5       # 5 = EIO


def _verified(path):
    """True when `path` is a complete checkpoint (magic, sizes, whole-file CRC)."""
    try:
        with _open(path, "rb") as f:
            _verify(f, path)
        return True
    except (OSError, ValueError):
        return False


def _promote(path, tmp):
    # The states an interruption can leave: PATH alone (nothing to do); PATH and a PATH.tmp
    # (a newer save cut short, or one whose rename never came: PATH is the checkpoint, the .tmp
    # is reused); PATH.tmp alone (power lost between unlink and rename on FAT). A complete lone
    # PATH.tmp is the only copy: it is renamed to PATH first, so writing the new PATH.tmp can
    # never destroy it; so is a complete PATH.tmp beside a PATH that fails its CRC (damaged
    # medium). A PATH.tmp that fails its CRC is never preferred: it is reused.
    if not _exists(tmp) or not _verified(tmp):
        return
    if _exists(path):
        if _verified(path):
            return
        what = "%r fails its check and %r holds a complete checkpoint" % (path, tmp)
    else:
        what = "%r is missing and %r holds the last complete checkpoint" % (path, tmp)
    try:
        replace_file(tmp, path)
    except OSError as e:
        raise OSError(_errno(e), "checkpoint.save: %s; renaming it to %r failed (%s), so nothing was "
                      "written and %r is kept" % (what, path, e, tmp))


def _dirname(path):
    i = max(path.rfind("/"), path.rfind(os.sep) if isinstance(getattr(os, "sep", None), str) else -1)
    return path[:i] if i > 0 else ("/" if i == 0 else ".")


def _save_error(e, path, tmp, size):
    # the OSError of a failed write, as a message naming the file and what to do
    n = _errno(e)
    if _exists(path):
        kept = "the partial copy was removed and %r is unchanged" % path
    else:
        kept = "the partial copy was removed (there was no checkpoint at %r before)" % path
    base = tmp[len(_dirname(tmp)):].lstrip("/")
    if n == 28 or (n == 36 and len(base) < 255):
        # 36 = ENAMETOOLONG: littlefs reports a volume too full to create a file's entry this way
        return OSError(28, "checkpoint.save: no space left on the volume for %r (%d bytes; errno %d)"
                       "; %s" % (tmp, size, n, kept))
    d = _dirname(path)
    if n == 2 and not _is_dir(d):
        return OSError(2, "checkpoint.save: cannot write %r: no such directory %r" % (path, d))
    return OSError(n, "checkpoint.save: writing %r failed (%s); %s" % (tmp, e, kept))


def _write(tmp, size, tag_b, meta_b, named, version):
    f = _open(tmp, "wb")
    try:
        w = _Writer(f)
        head = MAGIC + struct.pack("<HHI", version, 0, size)
        w.write(head)
        w.write(struct.pack("<I", crc32(head)))
        w.write(struct.pack("<H", len(tag_b)))
        w.write(tag_b)
        w.write(struct.pack("<I", len(meta_b)))
        w.write(meta_b)
        w.write(struct.pack("<I", len(named)))
        for name, p in named:
            nb = name.encode()
            w.write(struct.pack("<H", len(nb)))
            w.write(nb)
            w.write(struct.pack("<B", len(p.shape)))
            w.write(struct.pack("<%dI" % len(p.shape), *p.shape))
            i8 = _is_i8(p)
            if version != VERSION:
                w.write(bytes((_I8 if i8 else _F32,)))
            if i8:
                w.write(p.q, 1)
                w.write(p.scale)
            else:
                w.write(p.data)             # the array's own buffer, no copy
        if w.n != size - 4:
            raise RuntimeError("checkpoint.save: wrote %d bytes, planned %d" % (w.n, size - 4))
        f.write(struct.pack("<I", w.crc))
        f.flush()
        try:
            os.fsync(f.fileno())            # CPython; MicroPython syncs on close
        except (AttributeError, OSError):
            pass
    finally:
        f.close()


def replace_file(src, dst):
    """Rename src over dst: atomic where the filesystem renames over a file; elsewhere dst is
    removed first (a reader then finds dst missing and the complete src beside it)."""
    rep = getattr(os, "replace", None)      # CPython: atomic on POSIX and Windows
    if rep is not None:
        rep(src, dst)
        return
    try:
        os.rename(src, dst)                 # MicroPython: replaces on VfsPosix, littlefs, FAT
    except OSError:
        # A filesystem that refuses to rename over a file: unlink, then rename. In between,
        # load() finds PATH missing and reads the complete PATH.tmp.
        os.remove(dst)
        os.rename(src, dst)


# ---- load / read ------------------------------------------------------------------------

def _err(path, msg):
    return CheckpointError("checkpoint %r: %s" % (path, msg))


def _readn(f, n, path):
    b = f.read(n)
    if b is None or len(b) != n:
        raise _err(path, "malformed (record runs past the end)")
    return b


def _verify(f, path):
    """Pass 1: prefix, version, size, whole-file CRC. Returns file_size (the version: _parse)."""
    have = _file_size(path)
    head = f.read(_PREFIX)
    if len(head) >= 4 and head[:4] != MAGIC:
        raise _err(path, "not a microformer checkpoint (magic %r, expected %r)" % (head[:4], MAGIC))
    if len(head) < _PREFIX:
        raise _err(path, "truncated: %d bytes, a header alone needs %d" % (len(head), _PREFIX))
    version, flags, size, hcrc = struct.unpack("<HHII", head[4:16])
    if crc32(head[:12]) != hcrc:
        raise _err(path, "corrupt header (bad header CRC)")
    if version != VERSION and version != VERSION_INT8:
        raise _err(path, "unsupported version %d (this reader knows versions %d and %d)"
                   % (version, VERSION, VERSION_INT8))
    if have < size:
        raise _err(path, "truncated: expected %d bytes, got %d" % (size, have))
    if have > size:
        raise _err(path, "%d unexpected bytes after the end (expected %d bytes, got %d)"
                   % (have - size, size, have))
    crc = crc32(head)
    left = size - 4 - _PREFIX
    buf = bytearray(_CHUNK)
    mv = memoryview(buf)
    while left > 0:
        v = mv if left >= _CHUNK else mv[:left]     # no new view per full chunk: no garbage
        n = f.readinto(v)
        if n != len(v):
            raise _err(path, "truncated: expected %d bytes, got fewer while reading" % size)
        crc = crc32(v, crc)
        left -= n
    stored = struct.unpack("<I", _readn(f, 4, path))[0]
    if stored != crc:
        raise _err(path, "bad CRC (stored 0x%08x, computed 0x%08x): the file is corrupted"
                   % (stored, crc))
    return size


MAX_META_DEPTH = 32        # lists and dicts nested in the metadata (a spec of 8 Sequentials needs 18)


def _text(b, path, what):
    try:
        return b.decode()
    except UnicodeError:
        raise _err(path, "malformed: the %s is not UTF-8 (%r)" % (what, bytes(b[:32])))


def _depth_ok(v, limit):
    # the nesting depth of lists and dicts in v is at most `limit` (no recursion)
    todo = [(v, 1)]
    while todo:
        x, d = todo.pop()
        if d > limit:
            return False
        for y in (x.values() if isinstance(x, dict) else x):
            if isinstance(y, (list, dict)):
                todo.append((y, d + 1))
    return True


def _parse(f, path, size):
    """Pass 2 (file verified): tag, meta, and [(name, shape, data offset, dtype)] ."""
    f.seek(4)
    version = struct.unpack("<H", _readn(f, 2, path))[0]
    f.seek(_PREFIX)
    t = struct.unpack("<H", _readn(f, 2, path))[0]
    tag = _text(_readn(f, t, path), path, "model tag")
    m = struct.unpack("<I", _readn(f, 4, path))[0]
    text = _text(_readn(f, m, path), path, "metadata")
    try:
        meta = json.loads(text)
    except ValueError:
        raise _err(path, "malformed metadata (not JSON)")
    except (RuntimeError, MemoryError) as e:    # CPython: RecursionError; MicroPython: MemoryError
        raise _err(path, "malformed metadata: %d bytes of JSON nested too deeply (more than %d levels) "
                   "or too large to read (%s)" % (m, MAX_META_DEPTH, type(e).__name__))
    if not isinstance(meta, dict):
        raise _err(path, "malformed metadata: must be a JSON object, got %s" % (
            "null" if meta is None else type(meta).__name__))
    if not _depth_ok(meta, MAX_META_DEPTH):
        raise _err(path, "malformed metadata: lists and objects nested more than %d levels deep"
                   % MAX_META_DEPTH)
    n = struct.unpack("<I", _readn(f, 4, path))[0]
    pos = _PREFIX + 2 + t + 4 + m + 4
    recs = []
    for _ in range(n):
        L = struct.unpack("<H", _readn(f, 2, path))[0]
        name = _text(_readn(f, L, path), path, "name of tensor %d" % len(recs))
        r = _readn(f, 1, path)[0]
        shape = tuple(struct.unpack("<%dI" % r, _readn(f, 4 * r, path))) if r else ()
        pos += 2 + L + 1 + 4 * r
        dtype = _F32
        if version == VERSION_INT8:
            dtype = _readn(f, 1, path)[0]
            pos += 1
            if dtype not in (_F32, _I8) or (dtype == _I8 and r != 2):
                raise _err(path, "malformed tensor record %r: dtype %d with shape %r (known: 0 float32, "
                           "1 int8 rows of a matrix)" % (name, dtype, shape))
        nbytes = 4 * shape_size(shape) if dtype == _F32 else shape_size(shape) + 4 * shape[0]
        if r == 0 or pos + nbytes > size - 4:
            raise _err(path, "malformed tensor record %r (shape %r, %d bytes of data; %d bytes left in "
                       "the file)" % (name, shape, nbytes, max(0, size - 4 - pos)))
        recs.append((name, shape, pos, dtype))
        pos += nbytes
        f.seek(pos)
    if pos != size - 4:
        raise _err(path, "malformed (%d stray bytes before the CRC)" % (size - 4 - pos))
    return tag, meta, recs


def _read_floats(f, dst, offset, path, width=4):
    # one readinto straight into the array's own buffer (width: bytes per item)
    f.seek(offset)
    if f.readinto(memoryview(dst)) != width * len(dst):
        raise _err(path, "truncated while reading data")


def _read_tensor(f, p, rec, path):
    # a tensor's data into p (rec: shape, offset, dtype): float32 into p.data; int8 into p.q,
    # then its scales
    off = rec[1]
    if rec[2] == _I8:
        _read_floats(f, p.q, off, path, 1)
        _read_floats(f, p.scale, off + p.size, path)
    else:
        _read_floats(f, p.data, off, path)


def _dtypes(named, have, path, model):
    # the model's tensors as the file stores them, and the int8 weights to install once read
    # (quant.file_dtypes; only when one is int8): nothing in the model changes here
    for name, p in named:
        if have[name][2] == _I8 or _is_i8(p):
            from .quant import file_dtypes
            return file_dtypes(named, have, path, model, _err)
    return named, ()


_SCRATCH = 128      # floats per read when checking a record's values


def _check_values(f, path, recs):
    """Every value the records [(name, shape, offset, dtype)] hold is finite as float32: the
    float32 data, and each int8 row's scale (save() refuses the same). CheckpointError naming the
    tensor and the index otherwise; reads through one small buffer."""
    from . import backend
    from .finite import show
    K = backend.K
    buf = zeros(_SCRATCH)
    mv = memoryview(buf)
    for name, shape, off, dtype in recs:
        n = shape_size(shape)
        if dtype == _I8:
            off += n            # the scales follow the int8 values
            n = shape[0]
        f.seek(off)
        done = 0
        while done < n:
            k = n - done if n - done < _SCRATCH else _SCRATCH
            if f.readinto(mv if k == _SCRATCH else mv[:k]) != 4 * k:
                raise _err(path, "truncated while reading data")
            i = K.first_nonfinite(buf, k)
            if i >= 0:
                if dtype == _I8:
                    raise _err(path, "tensor %r: the int8 scale of row %d is %s (shape %r); a scale "
                               "must be finite, as save() requires; the model is unchanged"
                               % (name, done + i, show(buf[i]), shape))
                raise _err(path, "tensor %r holds %s at index %d (shape %r); a checkpoint's values must "
                           "be finite, as save() requires; the model is unchanged"
                           % (name, show(buf[i]), done + i, shape))
            done += k


def _read_all(f, path, named, have, swaps):
    # the last step of a load, every check passed: the data into the tensors, then the int8
    # weights (read into new objects) into their layers
    for name, p in named:
        _read_tensor(f, p, have[name], path)
    if swaps:
        from .quant import install
        install(swaps)


def _checked(f, path, named, want, model, tag_given):
    """Passes 1 and 2 of a load, nothing changed: the file verified, its tag, spec, names, shapes,
    dtypes and values against `named` (the model's tensors). Returns (meta, have, named as the file
    stores them, int8 swaps)."""
    size = _verify(f, path)
    ctag, meta, recs = _parse(f, path, size)
    if ctag != want:
        raise _err(path, "wrong model: checkpoint is for %r, this model is %r" % (ctag, want))
    if not tag_given and "spec" in meta:
        mine = _model_spec(model)       # None: a layer of one's own; tag and shapes decide
        if mine is not None:
            from .spec import difference
            d = difference(meta["spec"], mine)
            if d:
                raise _err(path, "wrong model: the checkpoint's spec differs from this model's (%s)" % d)
    have = {}
    for rec in recs:
        name = rec[0]
        if name in have:
            raise _err(path, "malformed (tensor %r twice)" % name)
        have[name] = rec[1:]
    for name, p in named:
        if name not in have:
            raise _err(path, "wrong model: checkpoint has no tensor %r" % name)
    if len(recs) != len(named):
        mine = {}
        for name, p in named:
            mine[name] = 1
        for rec in recs:
            if rec[0] not in mine:
                raise _err(path, "wrong model: checkpoint has tensor %r the model lacks" % rec[0])
    for name, p in named:
        shape = have[name][0]
        if tuple(shape) != tuple(p.shape):
            raise _err(path, "wrong shape: %s: expected %r, got %r" % (name, tuple(p.shape), shape))
    named, swaps = _dtypes(named, have, path, model)
    _check_values(f, path, recs)
    return meta, have, named, swaps


def load(path, model, tag=None):
    """Copy the weights in `path` into `model`; return the metadata dict.

    Everything is verified before the first weight changes (the file, the tag, the spec, every
    name, shape and dtype, every value finite); a refusal raises CheckpointError naming the file
    and the tensor, and leaves the model as it was. tag: the expected model tag; default
    model_tag(model).
    """
    _check_byteorder()
    path = _resolve(path, "checkpoint.load")
    want = model_tag(model) if tag is None else tag
    named = _named(model)
    with _open_read(path) as f:
        meta, have, named, swaps = _checked(f, path, named, want, model, tag is not None)
        _read_all(f, path, named, have, swaps)
    return meta


def read_header(path):
    """Verify `path` and return {'version', 'size', 'tag', 'meta', 'tensors': [(name, shape)]}."""
    path = _resolve(path, "checkpoint.read_header")
    with _open_read(path) as f:
        size = _verify(f, path)
        tag, meta, recs = _parse(f, path, size)
    tensors = [(r[0], r[1]) for r in recs]
    spec = find_spec(meta, "checkpoint %r" % path)
    if spec is not None:            # nothing is built: the spec's sizes are read off its arguments
        check_tensors(spec, tensors, "checkpoint %r" % path)
    f8 = [r[0] for r in recs if r[3] == _I8]
    return {"version": VERSION_INT8 if f8 else VERSION, "size": size, "tag": tag, "meta": meta,
            "tensors": tensors, "int8": f8}


def read(path):
    """(meta, [(name, shape, array('f'))]) of a verified checkpoint, for inspection (an int8
    tensor dequantized: q * scale). A NaN or inf value is refused, as load() refuses it."""
    _check_byteorder()
    path = _resolve(path, "checkpoint.read")
    out = []
    with _open_read(path) as f:
        size = _verify(f, path)
        tag, meta, recs = _parse(f, path, size)
        _check_values(f, path, recs)
        for rec in recs:
            name, shape = rec[0], rec[1]
            if rec[3] == _I8:
                from .quant import Int8Weight
                w = Int8Weight(shape, name)
                _read_tensor(f, w, rec[1:], path)
                a = w.dequantize().data
            else:
                a = zeros(shape_size(shape))
                _read_floats(f, a, rec[2], path)
            out.append((name, shape, a))
    return meta, out


def info(path, show=True):
    """A short summary: size, tag, meta, one line per tensor. Returns the text."""
    h = read_header(path)
    lines = ["%s: microformer checkpoint v%d, %d bytes" % (path, h["version"], h["size"]),
             "tag:  %s" % h["tag"], "meta: %s" % json.dumps(h["meta"])]
    total = 0
    for name, shape in h["tensors"]:
        total += shape_size(shape)
        lines.append("  %-12s %s%s" % (name, "x".join(str(d) for d in shape),
                                       "  int8" if name in h["int8"] else ""))
    lines.append("%d tensors, %d floats" % (len(h["tensors"]), total))
    s = "\n".join(lines)
    if show:
        print(s)
    return s


# ---- adapter checkpoints: only what was trained, for one base file --------------------------
# An adapter file is an MFCK file (same verification, atomic save, truncation safety) whose
# metadata has "adapter_of": {"crc": the base file's whole-file CRC32 (its last 4 bytes), "tag":
# the base's model tag}, and "lora": the adapters' spec entry (microformer.spec) when it holds
# any. Its tensors are the model's trainable ones (those with a grad buffer: the adapters, or the
# unfrozen tensors), under their checkpoint names. load_adapter() checks both files whole before
# the model changes: the adapter's tag and base CRC, its 'lora' entries (rank, alpha, targets
# against the model's linear maps) against its tensor table (names and shapes [rank, in] and
# [out, rank]: a forged rank is refused before anything is allocated), every value, then the
# base as load() checks it; only then are adapters added and both files read.
# The code is in microformer.adapterfile, imported on first use: a model that never meets an
# adapter keeps it off a small board's heap.

def base_id(base_path):
    """{'crc', 'tag'} of a verified checkpoint: what an adapter file names its base by."""
    from .adapterfile import base_id
    return base_id(sys.modules[__name__], base_path)


def save_adapter(path, model, base_path, meta=None):
    """Write the trainable tensors of `model` (LoRA adapters, or whatever is unfrozen) to `path`,
    naming the base checkpoint `base_path` they apply to (its CRC and tag). Returns the size."""
    from .adapterfile import save_adapter
    return save_adapter(sys.modules[__name__], path, model, base_path, meta)


def load_adapter(path, model, base_path):
    """Load base + adapter: refuse (CheckpointError) unless `path` is an adapter file for the
    checkpoint `base_path` (same CRC); load the base's weights into `model`, add the adapters the
    file describes (meta['lora']) unless the model has them, then its tensors. Both files are
    checked whole first: a refusal leaves the model as it was. Returns the adapter's metadata."""
    from .adapterfile import load_adapter
    return load_adapter(sys.modules[__name__], path, model, base_path)


# ---- the model spec a checkpoint carries ---------------------------------------------------

def find_spec(meta, where="checkpoint"):
    """The model spec a checkpoint's metadata describes, or None when it holds none: meta['spec'];
    for checkpoints written before specs, meta['layers'] (a layer list) or meta['arch']
    'iris-attention-v1' (the seed's Iris model). CheckpointError naming `where` when meta is
    not a dict or its layer list is malformed."""
    from .specformat import _short
    from .specplan import layer_list_spec
    if not isinstance(meta, dict):
        raise CheckpointError("%s: metadata must be a JSON object, got %s" % (where, _short(meta)))
    if "spec" in meta:
        return meta["spec"]
    if "layers" in meta:
        try:
            return layer_list_spec(meta["layers"], where)
        except ValueError as e:
            raise CheckpointError(str(e))
    from .models import IRIS_ARCH, IRIS_SPEC
    if meta.get("arch") == IRIS_ARCH:
        return IRIS_SPEC
    return None


def spec_of(meta, where="checkpoint"):
    """find_spec(meta, where), and CheckpointError when the metadata holds no spec."""
    spec = find_spec(meta, where)
    if spec is None:
        raise CheckpointError("%s: its metadata holds no model spec (meta['spec']; it was saved from a "
                              "model with a layer a spec cannot describe, or with spec=False): build the "
                              "model in code and use load_checkpoint" % where)
    return spec


def load_model(path, with_meta=False):
    """The model a checkpoint describes (its spec), with the checkpoint's weights. Before any
    layer is built, read_header has verified the file and compared its spec with its tensor
    table (names, shapes, sizes, MAX_PARAMS); every refusal is a CheckpointError naming the
    file. with_meta=True returns (model, meta). Checkpoints written before specs load too (see
    find_spec)."""
    from .spec import from_spec
    path = _fspath(path, "load_model")
    where = "checkpoint %r" % (path,)
    head = read_header(path)
    spec = spec_of(head["meta"], where)
    try:
        model = from_spec(spec)
    except ValueError as e:             # an argument the layer refuses (type, value, unknown name)
        raise CheckpointError("%s: %s" % (where, e))
    load(path, model)
    return (model, head["meta"]) if with_meta else model


def check_tensors(spec, tensors, where):
    """CheckpointError, naming `where` and what differs, unless `spec` is well formed, within
    MAX_PARAMS, and declares exactly the tensors [(name, shape)] of a file's table."""
    from .specplan import named_shapes, plan
    try:
        params = plan(spec)[0]
    except ValueError as e:
        raise CheckpointError("%s: bad model spec: %s" % (where, e))
    have = 0
    table = {}
    for name, shape in tensors:
        have += shape_size(shape)
        table[name] = tuple(shape)
    if params != have:
        raise CheckpointError("%s: the spec declares %d parameters (%d bytes), the file's tensors hold %d "
                              "(%d bytes)" % (where, params, 4 * params, have, 4 * have))
    mine = named_shapes(spec)
    for name, shape in mine:
        if table.get(name) != shape:
            raise CheckpointError("%s: the spec declares tensor %r %r, the file %s" % (
                where, name, shape, "has no tensor of that name" if name not in table else "holds %r" % (table[name],)))
    if len(mine) != len(tensors):
        names = {}
        for name, _ in mine:
            names[name] = 1
        for name, shape in tensors:
            if name not in names:
                raise CheckpointError("%s: the file holds tensor %r %r, which the spec does not declare"
                                      % (where, name, tuple(shape)))
        raise CheckpointError("%s: the spec declares %d tensors, the file holds %d" % (where, len(mine), len(tensors)))
