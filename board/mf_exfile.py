# mf_exfile.py: writing the user examples' file (mf_examples.Examples.append and .clear),
# imported on first use: a session that loads, fits and evaluates never writes it, and keeps this
# code off its heap. Each method of Writes is a method of Examples: mf_examples binds every name
# in METHODS to Examples on first use; Writes is never made.
import os
from array import array

from microformer.finite import float32_row

_CHUNK = 512       # bytes per read when copying the old file

METHODS = ("append", "_write", "clear")


def fmt(v):
    """A float as the example file writes it (6 significant digits)."""
    return "%.6g" % v


def exists(path):
    # (as mf_examples.exists, which this module does not import: the session's modules import no
    # circle)
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


class Writes:
    """Examples' methods that write its file (bound to Examples by mf_examples on first use)."""

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
