"""Saves never lose the last good copy: from every state an interrupted save can leave (PATH
alone; PATH with a complete, half or empty PATH.tmp; a lone complete, half or empty PATH.tmp;
nothing; a damaged PATH beside a complete PATH.tmp), a save cut short after every byte, as a
full volume (OSError 28: the save cleans up) or a power cut (the partial bytes stay), leaves the
previous checkpoint loadable, and a save that runs to the end leaves the new one and no .tmp.
On the host filesystem here (CPython, both MicroPython ports); on FAT and littlefs images in
test_checkpoint.py::test_micropython_board_filesystems."""
import json
import os
import random
import signal
import subprocess
import time

import pytest

import helpers
import checkpoint_states_mp as cs


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
    out = helpers.run_micropython(helpers.script("checkpoint_states_mp.py"), str(d), 5, exe=micropython)
    size = _expected(tmp_path)
    n = len(cs.STATES) * (2 * len(range(0, size, 5)) + 1)
    assert out.split() == ["states", str(n), str(n)], out


@pytest.mark.parametrize("kind", ["fat", "lfs2"])
def test_killed_mid_save_on_a_board_filesystem(tmp_path, kind, micropython):
    """SIGKILL a MicroPython process that saves in a loop on a FAT / littlefs image (kept in a
    host file: the blocks written before the kill stay), 12 times at random moments, each run
    starting from whatever the last one left and killed after its first whole save; after every
    kill the image holds a whole checkpoint of that run (its first save or a later one)."""
    exe = micropython
    script = helpers.script("checkpoint_kill_vfs_mp.py")
    image = str(tmp_path / "flash.img")
    env = helpers.micropython_env()

    def run(*args):
        p = subprocess.run([exe, "-X", "heapsize=4M", script] + list(args), capture_output=True, text=True,
                           env=env, timeout=120)
        assert p.returncode == 0, p.stdout + p.stderr
        return p.stdout
    run("mkfs", kind, image)
    rng = random.Random(11)
    last = None
    tmp_seen = 0
    for r in range(1, 13):
        p = subprocess.Popen([exe, "-X", "heapsize=4M", script, "loop", kind, image, str(r)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        line = p.stdout.readline()
        if line.strip() != b"ready":
            p.wait()
            raise AssertionError("run %d: %s" % (r, (line + p.stdout.read()).decode()))
        time.sleep(0.02 + rng.random() * 0.25)
        p.send_signal(signal.SIGKILL)
        p.wait()
        got = json.loads(run("check", kind, image))
        tmp_seen += "m.mfck.tmp" in got["files"]
        assert "error" not in got and got["whole"], (r, got)
        assert got["k"] > 1000 * r, (r, got)      # this run's first save or a later one
        last = got["k"]
    print("%s: last save %s; kills that left a .tmp: %d" % (kind, last, tmp_seen))
