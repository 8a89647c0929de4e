# mf_examples.py: the user's labelled examples on flash, for board/finetune.py's Session.
# The file is CSV (a header line, raw units, the label name last), read with microformer.data's
# reader; appending checks every row first and writes them in one go; clearing keeps the file
# as a backup (PATH.bak, then .bak2, ...), it never deletes it.
import os
from array import array


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



class Examples:
    """The user's examples: `path` on flash and its rows in memory (X: flat array('f') of raw
    features, y: class indices). read(path) -> (X, y, ...) is the session's CSV reader."""

    def __init__(self, path, features, classes, read):
        self.path = path
        self.features = features
        self.classes = classes
        self.X = array("f")
        self.y = []
        if exists(path):    # the same reader: a bad line is an error naming the file, line and column
            X, y = read(path)[:2]
            self.X = X
            self.y = y

    def __len__(self):
        return len(self.y)

    def append(self, rows):
        """Append checked rows [(features as floats, class index)] to the file, then here."""
        lines = []
        for x, c in rows:
            lines.append(",".join(fmt(v) for v in x) + "," + self.classes[c])
        new = True
        try:
            new = os.stat(self.path)[6] == 0
        except OSError:
            d = self.path.rsplit("/", 1)[0] if "/" in self.path else ""
            if d:
                try:
                    os.mkdir(d)
                except OSError:
                    pass
        with open(self.path, "a") as f:
            if new:
                f.write(",".join(self.features) + ",label\n")
            for line in lines:
                f.write(line + "\n")
        # what the file now says is what this store holds (a new Session reads the same)
        for line in lines:
            parts = line.split(",")
            self.X.extend(array("f", [float(p) for p in parts[:-1]]))
            self.y.append(self.classes.index(parts[-1]))

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
