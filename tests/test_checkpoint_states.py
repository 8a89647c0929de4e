"""Saves never lose the last good copy: from every state an interrupted save can leave (PATH
alone; PATH with a complete, half or empty PATH.tmp; a lone complete, half or empty PATH.tmp;
nothing; a damaged PATH beside a complete PATH.tmp), a save cut short after every byte, as a
full volume (OSError 28: the save cleans up) or a power cut (the partial bytes stay), leaves the
previous checkpoint loadable, and a save that runs to the end leaves the new one and no .tmp.
On the host filesystem here (CPython, both MicroPython ports); on FAT and littlefs images in
test_checkpoint.py::test_micropython_board_filesystems."""
import os

import helpers
import checkpoint_states as cs


def _expected(tmp_path):
    n = len(cs.image(cs.model(5), str(tmp_path / "size.mfck"), "new"))
    return n


def test_every_state_every_cut_cpython(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "fsync", lambda fd: None)       # not what is tested; 8000 saves
    d = tmp_path / "walk"
    d.mkdir()
    log = []
    tried, held = cs.walk(str(d), 1, log.append)
    assert not log, log[:5]
    size = _expected(tmp_path)
    assert tried == held == len(cs.STATES) * (2 * size + 1), (tried, held, size)


def test_every_state_micropython_host_filesystem(tmp_path, micropython):
    """Every 5th cut (the host filesystem behaves as on CPython; the board's filesystems are
    walked at every byte in test_checkpoint.py)."""
    d = tmp_path / "walk"
    d.mkdir()
    out = helpers.run_micropython(helpers.script("checkpoint_states.py"), str(d), 5, exe=micropython)
    size = _expected(tmp_path)
    n = len(cs.STATES) * (2 * len(range(0, size, 5)) + 1)
    assert out.split() == ["states", str(n), str(n)], out
