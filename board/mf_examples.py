# mf_examples.py: the user's labelled examples on flash, for board/finetune.py's Session.
# The file is CSV (a header line, raw units, the label name last), read with microformer.data's
# reader. Appending checks every row first (NaN / inf refused), then writes the old file and the
# new rows to PATH.tmp and renames it over PATH: all or nothing, even on a full flash or a power
# cut; a file whose last line has no newline gets one, so two rows are never merged. Clearing
# keeps the file as a backup (PATH.bak, then .bak2, ...), it never deletes it. The writes live in
# mf_exfile.py, imported on first use (a session that only fits and evaluates never writes).
import gc
import os
from array import array

from microformer.lazy import adopt, stub


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


def exists(path):
    try:
        os.stat(path)
        return True
    except OSError:
        return False


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


def _exfile():
    # mf_exfile (the user-data file's writes), imported now if it is not yet; its functions become
    # the methods of Examples. Returns its class Writes
    try:
        import mf_exfile
    except ImportError as e:      # the text says what failed: MicroPython keeps no chained cause
        raise ImportError("mf_exfile (writing the user examples' file) failed to import: %s" % e)
    return adopt(Examples, mf_exfile.Writes, mf_exfile.METHODS)


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

    # writing the file (mf_exfile.py, loaded on first use: a session that only fits and
    # evaluates never writes it): append(rows), clear(); its functions replace these stubs then
    append = stub(_exfile, "append")
    clear = stub(_exfile, "clear")

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
