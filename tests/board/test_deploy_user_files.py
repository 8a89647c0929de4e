"""make deploy owns only what it wrote: a board holding the user's own files (a root .py, an extra
module in /lib/microformer, a row appended to the data, a lone complete .tmp from an interrupted
save, a deployed file changed on the board) keeps every byte of them, by name or in a .bak that
deploy names; a second deploy with nothing changed writes nothing. And the Makefile never makes
or overwrites a checkpoint the user names; DATA defaults to the checkpoint's own base data."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

import helpers
import board_link  # noqa: E402
import deploy  # noqa: E402
import vboard  # noqa: E402

MICROPYTHON = helpers.interpreter_path(helpers.interpreters()[-1])
ROOT = pathlib.Path(helpers.ROOT)


def _snapshot(flash):
    """{board path: (bytes, mtime_ns)} of every file on the flash folder."""
    return {"/" + p.relative_to(flash).as_posix(): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(flash.rglob("*")) if p.is_file()}


def _tuned_copy(src, dst):
    """A complete, loadable checkpoint that differs from `src` (as a fine-tune on the board would)."""
    import microformer as mf
    from microformer import checkpoint
    model, meta = mf.load_model(str(src), with_meta=True)
    meta = dict(meta, note="fine-tuned on the board")
    checkpoint.save(str(dst), model, meta)
    return dst.read_bytes()


def _kept(flash, path, data):
    """Where on the flash `data` (the user's bytes once at `path`) is now: path itself or a .bak."""
    folder = (flash / path.lstrip("/")).parent
    for p in sorted(folder.iterdir()):
        if p.is_file() and p.read_bytes() == data:
            return "/" + p.relative_to(flash).as_posix()
    return None


def test_deploy_keeps_every_byte_of_the_users_files(tmp_path, iris_checkpoint):
    with vboard.VirtualBoard(tmp_path / "vb", heap=helpers.board_heap(MICROPYTHON), micropython=MICROPYTHON) as b:
        port, flash = str(b.port), b.flash
        deploy.deploy(port, str(iris_checkpoint), say=lambda s: None)
        assert (flash / "model.mfck").read_bytes() == iris_checkpoint.read_bytes()
        manifest = json.loads((flash / ".microformer-deploy.json").read_text())["files"]
        assert manifest["/model.mfck"] == deploy.sha256_file(iris_checkpoint)

        # what a user does to a board between deploys
        user = {
            "/sensor.py": b"import machine\nprint('my sensor')\n",               # clashes with board/demos/sensor.py
            "/finetune.py": (ROOT / "board" / "finetune.py").read_bytes() + b"# my change\n",
            "/lib/microformer/mylayer.py": b"class MyLayer:\n    pass\n",
            "/data/iris.csv": (flash / "data" / "iris.csv").read_bytes() + b"6.1,2.8,4.7,1.2,versicolor\n",
            "/mf_examples.mpy": b"M\x06my own build of a deployed module",          # a deployed file, changed
            "/model.mfck.tmp": _tuned_copy(iris_checkpoint, tmp_path / "tuned.mfck"),
        }
        for p, data in user.items():
            (flash / p.lstrip("/")).write_bytes(data)
        (flash / "model.mfck").unlink()      # a power cut in the FAT fallback: only the .tmp is left
        # a module an older deploy wrote and this version no longer ships: deploy's own, so it goes
        (flash / "lib" / "microformer" / "gone.mpy").write_bytes(b"M\x06old module")
        manifest["/lib/microformer/gone.mpy"] = deploy.sha256_file(flash / "lib" / "microformer" / "gone.mpy")
        (flash / ".microformer-deploy.json").write_text(json.dumps({"version": 1, "files": manifest}))

        out = deploy.deploy(port, str(iris_checkpoint), say=lambda s: None)
        for p, data in user.items():
            where = _kept(flash, p, data)
            assert where is not None, "deploy lost the user's %s:\n%s" % (p, out)
            assert where in out and p in out, (p, where, out)      # and said where it is
        assert _kept(flash, "/lib/microformer/mylayer.py", user["/lib/microformer/mylayer.py"]) \
            == "/lib/microformer/mylayer.py", "an extra module must stay where the user put it"
        assert "RECOVERED /model.mfck.tmp" in out and "model.mfck.bak" in out, out
        assert not (flash / "model.mfck.tmp").exists()       # the next save() cannot overwrite it
        assert "KEPT /sensor.py as /sensor.py.bak" in out and "KEPT /finetune.py as /finetune.py.bak" in out, out
        assert "KEPT /data/iris.csv as /data/iris.csv.bak" in out, out
        assert "removed stale /lib/microformer/gone.mpy" in out and not (flash / "lib/microformer/gone.mpy").exists()
        # the deploy itself is complete: the host's files at their places, no .py shadowing a .mpy
        assert (flash / "model.mfck").read_bytes() == iris_checkpoint.read_bytes()
        assert (flash / "data" / "iris.csv").read_bytes() == (ROOT / "datasets" / "iris.csv").read_bytes()
        assert not (flash / "finetune.py").exists() and not (flash / "sensor.py").exists()
        assert (flash / "mf_examples.mpy").read_bytes() != user["/mf_examples.mpy"]
        manifest = json.loads((flash / ".microformer-deploy.json").read_text())["files"]
        assert not [p for p in manifest if ".bak" in p or p.endswith("mylayer.py")], manifest
        # the recovered checkpoint opens on the board
        r = board_link.mpremote(port, "exec", "import finetune\ns = finetune.Session('model.mfck.bak', verbose=False)\n"
                                "print('NOTE', s.meta.get('note'))", timeout=300)
        assert "NOTE fine-tuned on the board" in r, r

        # nothing changed: a second deploy writes nothing at all
        before = _snapshot(flash)
        out = deploy.deploy(port, str(iris_checkpoint), say=lambda s: None)
        assert _snapshot(flash) == before, out
        assert "copied 0 files, nothing else changed" in out, out
        assert "KEPT" not in out and "removed" not in out, out


def test_force_replaces_and_an_incomplete_tmp_is_kept(tmp_path, iris_checkpoint):
    with vboard.VirtualBoard(tmp_path / "vb", heap=helpers.board_heap(MICROPYTHON), micropython=MICROPYTHON) as b:
        port, flash = str(b.port), b.flash
        deploy.deploy(port, str(iris_checkpoint), say=lambda s: None)
        tuned = _tuned_copy(iris_checkpoint, flash / "model.mfck")          # s.save() on the board
        half = tuned[:len(tuned) // 2]
        (flash / "model.mfck.tmp").write_bytes(half)                          # a save cut short
        (flash / "data" / "iris.csv").write_bytes(b"mine\n")
        out = deploy.deploy(port, str(iris_checkpoint), force=True, say=lambda s: None)
        assert (flash / "model.mfck").read_bytes() == iris_checkpoint.read_bytes()
        assert "FORCE: removed /model.mfck" in out and "FORCE: removed /data/iris.csv" in out, out
        assert _kept(flash, "/model.mfck", tuned) is None             # FORCE keeps no copy, as it says
        # an interrupted save is not a file in deploy's way: FORCE or not, it is kept, and named
        assert (flash / "model.mfck.tmp.bak").read_bytes() == half
        assert "KEPT /model.mfck.tmp as /model.mfck.tmp.bak: an interrupted save, not loadable" in out, out


def test_a_board_from_before_the_manifest(tmp_path, iris_checkpoint, pretrained_iris):
    """Older deploys left .mpy modules, /iris.mfck and its SHA record /iris.mfck.deployed: the modules
    count as deploy's (replaced, no .bak), /iris.mfck stays and deploy says how to open it."""
    with vboard.VirtualBoard(tmp_path / "vb", heap=helpers.board_heap(MICROPYTHON), micropython=MICROPYTHON) as b:
        port, flash = str(b.port), b.flash
        (flash / "lib" / "microformer").mkdir(parents=True)
        (flash / "lib" / "microformer" / "attention.mpy").write_bytes(b"M\x06older build")
        (flash / "finetune.mpy").write_bytes(b"M\x06older build")
        old = iris_checkpoint.read_bytes()
        (flash / "iris.mfck").write_bytes(old)
        (flash / "iris.mfck.deployed").write_text(deploy.sha256_file(iris_checkpoint))
        out = deploy.deploy(port, str(iris_checkpoint), say=lambda s: None)
        assert "before deploy kept a manifest" in out, out
        assert not list(flash.rglob("*.mpy.bak")), out
        assert (flash / "iris.mfck").read_bytes() == old and (flash / "model.mfck").read_bytes() == old
        assert "finetune.Session('iris.mfck') opens it" in out, out


def _make(*args):
    # -o: never (re)install the shared virtualenv from a test
    return subprocess.run(["make", "-s", "--no-print-directory", "-o", ".venv/.installed"] + list(args),
                          cwd=helpers.ROOT, capture_output=True, text=True, timeout=120)


def test_make_never_builds_or_overwrites_a_named_checkpoint(tmp_path):
    mine = tmp_path / "mine.mfck"
    r = _make("-n", "deploy", "CHECKPOINT=%s" % mine)
    assert "pretrain.py" not in r.stdout and "deploy.py --checkpoint \"%s\"" % mine in r.stdout, r.stdout
    # missing: a clear error naming it, and nothing created
    r = _make("deploy", "CHECKPOINT=%s" % mine, "PORT=/nonexistent")
    assert r.returncode != 0 and not mine.exists()
    assert "CHECKPOINT %s: no such file" % mine in r.stderr, r.stdout + r.stderr
    # older than every source: still the user's, untouched (make used to regenerate it as Iris)
    mine.write_bytes(b"the user's bytes")
    os.utime(mine, (1e9, 1e9))
    r = _make("-n", "deploy", "CHECKPOINT=%s" % mine)
    assert "pretrain.py" not in r.stdout, r.stdout
    r = _make("deploy", "CHECKPOINT=%s" % mine, "PORT=/nonexistent")
    assert r.returncode != 0 and "CHECKPOINT %s is not a loadable checkpoint" % mine in r.stderr, r.stderr
    assert mine.read_bytes() == b"the user's bytes"
    # the project's own default is the one file pretraining makes
    r = _make("-n", "-W", "host/tools/pretrain.py", "pretrain", "CHECKPOINT=%s" % mine)   # -W: as if pretrain.py changed
    assert "--out build/iris.mfck" in r.stdout and str(mine) not in r.stdout, r.stdout


@pytest.fixture
def user_checkpoint(tmp_path, iris_checkpoint):
    """A copy of the Iris checkpoint whose meta names `mine.csv` as its base data."""
    import microformer as mf
    from microformer import checkpoint
    model, meta = mf.load_model(str(iris_checkpoint), with_meta=True)
    path = tmp_path / "ck" / "mine.mfck"
    path.parent.mkdir()
    checkpoint.save(str(path), model, dict(meta, data="mine.csv"))
    return path


def test_data_defaults_to_the_checkpoints_base_data(user_checkpoint, tmp_path):
    said = []
    meta = deploy.check_checkpoint(user_checkpoint)
    # not next to the checkpoint, not in datasets/: nothing copied, and deploy says where it looked
    assert deploy.resolve_data(None, user_checkpoint, meta, said.append) == []
    assert "'mine.csv'" in said[-1] and str(user_checkpoint.parent / "mine.csv") in said[-1], said
    assert "none copied" in said[-1]
    # next to the checkpoint: that file
    (user_checkpoint.parent / "mine.csv").write_text("a,label\n1,x\n")
    assert deploy.resolve_data(None, user_checkpoint, meta, said.append) == [user_checkpoint.parent / "mine.csv"]
    assert "-> :/data/mine.csv" in said[-1], said
    # the project's checkpoint names iris.csv: found in datasets/
    iris_meta = dict(meta, data="iris.csv")
    assert deploy.resolve_data(None, user_checkpoint, iris_meta, said.append) == [deploy.DATASETS / "iris.csv"]
    # DATA= takes paths and names in datasets/; a name in neither place is refused with both tried
    other = tmp_path / "other.csv"
    other.write_text("a,label\n")
    got = deploy.resolve_data([str(other), "digits.csv"], user_checkpoint, meta, said.append)
    assert got == [other, deploy.DATASETS / "digits.csv"]
    assert "finetune.Session() reads data/mine.csv" in said[-1], said
    with pytest.raises(SystemExit, match="DATA nope.csv: no such file"):
        deploy.resolve_data(["nope.csv"], user_checkpoint, meta, said.append)
    # a checkpoint without meta['data']: no data, said so
    assert deploy.resolve_data(None, user_checkpoint, {}, said.append) == []
    assert "names no base data file" in said[-1]


def test_deploy_cli_names_a_damaged_checkpoint(tmp_path, iris_checkpoint):
    bad = tmp_path / "bad.mfck"
    data = bytearray(iris_checkpoint.read_bytes())
    data[len(data) // 2] ^= 0x10
    bad.write_bytes(bytes(data))
    r = subprocess.run([sys.executable, "host/tools/deploy.py", "--port", "/nonexistent", "--checkpoint", str(bad)],
                       cwd=helpers.ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "CHECKPOINT %s is not a loadable checkpoint" % bad in r.stderr, r.stderr


def test_make_deploy_copies_your_checkpoint_and_its_data(tmp_path, user_checkpoint):
    """The whole command as a user types it: their checkpoint lands at /model.mfck, the base data its
    meta names (next to it) at /data/, and deploy says where they went and how to open them."""
    rows = "sepal_length,sepal_width,petal_length,petal_width,species\n5.1,3.5,1.4,0.2,setosa\n"
    (user_checkpoint.parent / "mine.csv").write_text(rows)
    with vboard.VirtualBoard(tmp_path / "vb", heap=helpers.board_heap(MICROPYTHON), micropython=MICROPYTHON) as b:
        r = _make("deploy", "CHECKPOINT=%s" % user_checkpoint, "PORT=%s" % b.port)
        assert r.returncode == 0, r.stdout + r.stderr
        assert (b.flash / "model.mfck").read_bytes() == user_checkpoint.read_bytes()
        assert (b.flash / "data" / "mine.csv").read_text() == rows
        assert not (b.flash / "data" / "iris.csv").exists()
    assert "data: %s (the base data the checkpoint's meta names) -> :/data/mine.csv" % (
        user_checkpoint.parent / "mine.csv") in r.stdout, r.stdout
    assert "checkpoint: copied %s to :/model.mfck; open it on the board: import finetune; " \
           "s = finetune.Session()" % user_checkpoint in r.stdout, r.stdout


def test_a_damaged_manifest_makes_every_file_the_users():
    said = []
    assert deploy.read_manifest(None, said.append) is None and said == []
    good = json.dumps({"version": 1, "files": {"/a.mpy": "ab" * 32}})
    assert deploy.read_manifest(good, said.append) == {"/a.mpy": "ab" * 32} and said == []
    for bad in ("{not json", json.dumps({"files": ["/a.mpy"]}), json.dumps({"version": 1})):
        assert deploy.read_manifest(bad, said.append) == {}, bad
        assert deploy.MANIFEST in said[-1] and "every file on the board counts as yours" in said[-1], said


def test_a_manifest_deploy_cannot_read_counts_as_absent(tmp_path, iris_checkpoint, deployed_flash):
    # invalid UTF-8, a folder, 12,000 forged entries (about 1 MB): each time the next deploy works,
    # keeps the user's changed file as .bak (nothing deploy cannot prove it wrote is overwritten)
    # and writes a good manifest; a folder in the manifest's place is kept as .bak. The board starts
    # deployed (conftest.deployed_flash): the first deploy below finds it current
    deployed_flash(tmp_path / "vb", MICROPYTHON)
    with vboard.VirtualBoard(tmp_path / "vb", heap=helpers.board_heap(MICROPYTHON), micropython=MICROPYTHON) as b:
        port, flash = str(b.port), b.flash
        deploy.deploy(port, str(iris_checkpoint), say=lambda s: None)
        m = flash / ".microformer-deploy.json"
        for kind in ("utf8", "folder", "big"):
            mine = ("# my own notes before the %s manifest\n" % kind).encode()
            (flash / "golden" / "attention.mfg").write_bytes(mine)          # a deployed file, changed
            m.unlink()
            if kind == "utf8":
                m.write_bytes(b'{"version": 1, "files": {"/golden/attention.mfg": "\xff\xfe"}}')
            elif kind == "folder":
                m.mkdir()
                (m / "note.txt").write_text("a folder where the manifest goes")
            else:
                m.write_text(json.dumps({"version": 1, "files": dict(("/f%05d.mpy" % i, "ab" * 32)
                                                                     for i in range(12000))}))
            said = []
            out = deploy.deploy(port, str(iris_checkpoint), say=said.append)
            where = _kept(flash, "/golden/attention.mfg", mine)
            assert where is not None and where.startswith("/golden/attention.mfg.bak"), (kind, out)
            assert any("counts as absent" in s for s in said), (kind, said)
            assert json.loads(m.read_text())["files"]["/model.mfck"] == deploy.sha256_file(iris_checkpoint)
        assert (flash / ".microformer-deploy.json.bak" / "note.txt").read_text() == "a folder where the manifest goes"
