"""The line-safe append of the user's examples (board/mf_examples.py), under CPython with a file
whose write() returns a short count, as some ports do on a full volume: the append fails naming
the file, and the file, its store and the folder are as they were (no partial row, no .tmp)."""
import builtins

import pytest

import mf_examples
import mf_exfile
from microformer.data import read_rows

HEADER = "ax,ay,az,label\n"


class _Short:
    """A file whose write() keeps only the first half of what it is given and says so."""

    def __init__(self, f):
        self.f = f

    def write(self, data):
        n = max(1, len(data) // 2)
        return self.f.write(bytes(data[:n]))

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.f.close()


def _store(tmp_path):
    path = tmp_path / "user.csv"
    path.write_text(HEADER + "0.1,0.2,0.3,tap\n")
    ex = mf_examples.Examples(str(path), ["ax", "ay", "az"], ["tap", "hold"],
                              lambda p: read_rows(p, ["tap", "hold"], None, 3)[:2])
    return path, ex


def test_a_short_write_appends_nothing(tmp_path, monkeypatch):
    path, ex = _store(tmp_path)
    before = path.read_bytes()

    def short_open(name, mode="r", *a, **kw):
        f = builtins.open(name, mode, *a, **kw)
        return _Short(f) if "w" in mode else f
    monkeypatch.setattr(mf_exfile, "open", short_open, raising=False)   # the module that writes
    with pytest.raises(OSError) as e:
        ex.append([([1.0, 2.0, 3.0], 1)])
    assert "user.csv" in str(e.value) and "as it was" in str(e.value), e.value
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["user.csv"]     # no .tmp left
    assert len(ex) == 1 and list(ex.X) == pytest.approx([0.1, 0.2, 0.3])


def test_a_full_write_appends(tmp_path):
    path, ex = _store(tmp_path)
    ex.append([([1.0, 2.0, 3.0], 1)])
    assert path.read_text() == HEADER + "0.1,0.2,0.3,tap\n1,2,3,hold\n"
    assert len(ex) == 2


def test_a_label_a_csv_cannot_hold_is_refused_before_writing(tmp_path):
    # meta.check refuses such class names when a session starts; the store refuses them too
    path = tmp_path / "user.csv"
    path.write_text(HEADER + "0.1,0.2,0.3,tap\n")
    ex = mf_examples.Examples(str(path), ["ax", "ay", "az"], ["tap", "hold,long"],
                              lambda p: read_rows(p, ["tap", "hold,long"], None, 3)[:2])
    with pytest.raises(ValueError, match=r"user.csv.*'hold,long'.*CSV"):
        ex.append([([1.0, 2.0, 3.0], 1)])
    assert path.read_text() == HEADER + "0.1,0.2,0.3,tap\n" and len(ex) == 1
