# mf_examples.py: the user's labelled examples on flash, for board/finetune.py's Session.
# The file is CSV (a header line, raw units, the label name last), read with microformer.data's
# reader. Appending checks every row first (NaN / inf refused), then writes the old file and the
# new rows to PATH.tmp and renames it over PATH: all or nothing, even on a full flash or a power
# cut; a file whose last line has no newline gets one, so two rows are never merged. Clearing
# keeps the file as a backup (PATH.bak, then .bak2, ...), it never deletes it.
import gc
import os
from array import array

from microformer.finite import float32_row

_CHUNK = 512       # bytes per read when copying the old file

# ---- shared by the session's modules: mf_session and those it imports on first use
# (mf_commands, mf_adapter, mf_guard, mf_drift), which never import mf_session
SELECTIONS = ("train", "test", "base", "user", "all")


class Result:
    """A small result: its fields as attributes and as r['field']; repr is one line."""

    def __init__(self, line, fields):
        self._line = line
        self._fields = fields
        for k in fields:
            setattr(self, k, fields[k])

    def __getitem__(self, key):
        return self._fields[key]

    def get(self, key, default=None):
        return self._fields.get(key, default)

    def keys(self):
        return self._fields.keys()

    def __repr__(self):
        return self._line


def _mem_free():
    gc.collect()
    try:
        return gc.mem_free()
    except AttributeError:
        return None


def _n(k, word):
    """'1 step', '2 steps'."""
    return "%d %s%s" % (k, word, "" if k == 1 else "s")


def _is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v


def fmt(v):
    """A float as the example file writes it (6 significant digits)."""
    return "%.6g" % v


def exists(path):
    try:
        os.stat(path)
        return True
    except OSError:
        return False


def backup_path(path):
    """The first free name of PATH.bak, PATH.bak2, PATH.bak3, ... (a board may have no clock)."""
    k = path + ".bak"
    i = 2
    while exists(k):
        k = "%s.bak%d" % (path, i)
        i += 1
    return k



# ---- which user-data file belongs to which checkpoint --------------------------------------
# Each checkpoint has its own examples: data/<name>.user.csv for <name>.mfck, except the
# deployed model.mfck, whose examples stay in data/user.csv (where they have always been).
USER_DATA = "data/user.csv"


def user_data_for(checkpoint):
    """The default user-data file of a checkpoint path (relative to the session's root)."""
    name = checkpoint.rsplit("/", 1)[-1]
    if ".mfck" in name:              # NAME.mfck, and a deploy's NAME.mfck.bak copy of it
        name = name[:name.index(".mfck")]
    if name == "model":
        return USER_DATA
    return "data/%s.user.csv" % name


def foreign(path, fields, checkpoint_path, root_path, meta):
    """None when the user-data file at `path` does not exist or has `fields` fields in its
    header, else the error saying which checkpoint its examples belong to and how to open that
    one (mf_owner, loaded only then): the file is never offered for deletion."""
    if not exists(path):
        return None
    with open(path, "rb") as f:      # bytes: a line past the header need not be UTF-8 here
        head = f.readline()
    try:
        head = head.decode().strip()
    except UnicodeError:
        return None          # the reader names the file and the line that is not UTF-8
    if len(head.split(",")) == fields:
        return None          # the reader checks the rest, line by line
    from mf_owner import foreign as message
    return message(path, head, meta, checkpoint_path, root_path, user_data_for)


class Examples:
    """The user's examples: `path` on flash and its rows in memory (X: flat array('f') of raw
    features, y: class indices). read(path) -> (X, y, ...) is the session's CSV reader. last: the
    header's name for the last field (a regression model's last target)."""

    def __init__(self, path, features, classes, read, last="label"):
        self.path = path
        self.features = features
        self.last = last
        self.classes = classes
        self.X = array("f")
        self.y = []
        _recover(path)
        if exists(path):    # the same reader: a bad line is an error naming the file, line and column
            X, y = read(path)[:2]
            self.X = X
            self.y = y

    def __len__(self):
        return len(self.y)

    def append(self, rows):
        """Append checked rows [(features as floats, class index)] to the file, then here: all or
        nothing (any error, Ctrl-C included, leaves the file and this store as they were)."""
        lines = []
        for k in range(len(rows)):
            x, c = rows[k]
            float32_row("append to %s" % self.path, x, self.features, k)
            label = self.classes[c]
            if "," in label or "\n" in label or "\r" in label or label != label.strip():
                raise ValueError("append to %s: label %r cannot be written as a CSV field and read back "
                                 "(a comma, newline or space at either end); nothing was written"
                                 % (self.path, label))
            lines.append(",".join(fmt(v) for v in x) + "," + label)
        text = "\n".join(lines) + "\n"
        old = exists(self.path)
        if not old:
            d = self.path.rsplit("/", 1)[0] if "/" in self.path else ""
            if d and not exists(d):
                os.mkdir(d)
        tmp = self.path + ".tmp"
        try:
            repaired = self._write(tmp, old, text.encode())
            from microformer.checkpoint import replace_file    # imported here: a session drops it after loading
            replace_file(tmp, self.path)
        except BaseException as e:          # a write error, a full flash, Ctrl-C: the file stays
            try:
                os.remove(tmp)
            except OSError:
                pass
            if isinstance(e, OSError):
                code = e.args[0] if e.args else 5
                raise OSError(code, "appending to %r failed (OSError %s%s); %r is as it was"
                              % (self.path, e, ": no space left on the flash" if code == 28 else "",
                                 self.path))
            raise
        if repaired:
            print("note: %s did not end with a newline; one was added before the new rows"
                  % self.path)
        # what the file now says is what this store holds (a new Session reads the same)
        for line in lines:
            parts = line.split(",")
            self.X.extend(array("f", [float(p) for p in parts[:-1]]))
            self.y.append(self.classes.index(parts[-1]))

    def _write(self, tmp, old, new):
        """PATH.tmp = the old file (a header when there is none), a newline if its last line
        lacks one, then `new`, in one write; True when that newline was added."""
        repaired = False
        f = open(tmp, "wb")
        try:
            last = b""
            if old:
                with open(self.path, "rb") as src:
                    buf = bytearray(_CHUNK)
                    mv = memoryview(buf)
                    while True:
                        n = src.readinto(buf)
                        if not n:
                            break
                        _write_all(f, mv[:n], tmp)
                        last = buf[n - 1:n]
            if not last:
                new = (",".join(self.features) + "," + self.last + "\n").encode() + new
            elif last != b"\n":
                new = b"\n" + new
                repaired = True
            _write_all(f, new, tmp)
        finally:
            f.close()
        return repaired

    def clear(self):
        """Forget the examples; the file becomes PATH.bak (.bak2, ...). Returns that path, or
        None when there was no file."""
        kept = None
        if exists(self.path):
            kept = backup_path(self.path)
            os.rename(self.path, kept)
        self.X = array("f")
        self.y = []
        return kept


def _write_all(f, data, path):
    # one write; a short count (a full volume on some ports) is an error, not a partial row
    n = f.write(data)
    if n is not None and n != len(data):
        raise OSError(28, "%r: wrote %d of %d bytes (no space left?)" % (path, n, len(data)))


def _recover(path):
    """A complete PATH.tmp with no PATH (a power cut between the unlink and the rename of a
    filesystem that cannot rename over a file) becomes PATH again; an append always ends its
    file with a newline, so a .tmp without one was cut short and is left alone."""
    tmp = path + ".tmp"
    if exists(path) or not exists(tmp):
        return
    size = os.stat(tmp)[6]
    if size:
        with open(tmp, "rb") as f:
            f.seek(size - 1)
            last = f.read(1)
        if last == b"\n":
            os.rename(tmp, path)
            print("note: %s was missing; restored it from the complete %s (an append cut short "
                  "by a power loss)" % (path, tmp))
            return
    print("note: %s is missing and %s is incomplete (%d bytes, no final newline): not used"
          % (path, tmp, size))
