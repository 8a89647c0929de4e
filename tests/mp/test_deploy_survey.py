"""The survey deploy runs on the board (host/tools/deploy.py SURVEY), run by both MicroPython ports on a
sandboxed flash: a manifest of invalid UTF-8 bytes, a folder, or 1 MB of forged entries is
reported as unreadable (and read no further), never an error that stops every deploy."""
import json
import subprocess

import pytest

import deploy


def _survey(exe, flash, heap="256K"):
    code = ("import vfs, os\nvfs.umount('/')\nvfs.mount(vfs.VfsPosix(%r), '/')\nos.chdir('/')\n" % str(flash)
            + deploy.survey_code(["/finetune.mpy"], ["/", deploy.LIB_DIR]))
    p = subprocess.run([exe, "-X", "heapsize=" + heap, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("SURVEY ")]
    assert line, p.stdout
    return json.loads(line[0][len("SURVEY "):])


@pytest.mark.parametrize("kind", ["utf8", "folder", "big", "good"])
def test_survey_reads_the_manifest_defensively(tmp_path, micropython, kind):
    flash = tmp_path / "flash"
    flash.mkdir()
    (flash / "finetune.mpy").write_bytes(b"M\x06")
    m = flash / deploy.MANIFEST.lstrip("/")
    good = json.dumps({"version": 1, "files": {"/finetune.mpy": "ab" * 32}})
    if kind == "utf8":
        m.write_bytes(b'{"version": 1, "files": {"/a\xff\xfe": "x"}}')
    elif kind == "folder":
        m.mkdir()
    elif kind == "big":             # 12,000 forged entries, about 1 MB: the survey must not read them
        m.write_text(json.dumps({"version": 1, "files": dict(("/f%05d.mpy" % i, "ab" * 32)
                                                             for i in range(12000))}))
    else:
        m.write_text(good)
    r = _survey(micropython, flash)
    assert "/finetune.mpy" in r["sha"]
    want = {"utf8": "not UTF-8 text", "folder": "a folder",
            "big": "%d bytes, more than the %d" % (m.stat().st_size if kind == "big" else 0, deploy.MANIFEST_MAX),
            "good": None}[kind]
    if want is None:
        assert r["manifest"] == good and "manifest_bad" not in r
    else:
        assert r["manifest"] is None and want in r["manifest_bad"], r


def test_survey_reads_a_full_manifest_in_a_busy_heap(tmp_path, micropython):
    """A full deploy's manifest (about 8 KB) is read with a buffer of its own size: a survey after a
    fine-tune on the board has little contiguous heap left, and one 32 KB buffer stopped every deploy."""
    flash = tmp_path / "flash"
    flash.mkdir()
    (flash / "finetune.mpy").write_bytes(b"M\x06")
    m = flash / deploy.MANIFEST.lstrip("/")
    text = json.dumps({"version": 1, "files": dict(("/f%03d.mpy" % i, "ab" * 32) for i in range(100))})
    m.write_text(text)
    assert 7000 < len(text) < deploy.MANIFEST_MAX // 2
    r = _survey(micropython, flash, heap="32K")
    assert r["manifest"] == text and "manifest_bad" not in r
