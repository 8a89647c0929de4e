"""What deploy decides from a board's survey (host/tools/deploy.py plan_deploy), without a board: a file
the user changed or wrote is kept as .bak, never overwritten; a manifest deploy cannot read
(not UTF-8, a folder, too big, not a manifest) counts as absent, so every file in deploy's way is
kept as the user's."""
import json

import pytest

import deploy

SHA_OLD, SHA_NEW, SHA_USER = "a" * 64, "b" * 64, "c" * 64


def _survey(files, manifest=None, bad=None, names=None):
    dirs = {"/": names if names is not None else sorted({p.strip("/").split("/")[0] for p in files}),
            "/data": [p.rsplit("/", 1)[1] for p in files if p.startswith("/data/")],
            "/lib": ["microformer/"], deploy.LIB_DIR: [p.rsplit("/", 1)[1] for p in files
                                                       if p.startswith(deploy.LIB_DIR + "/")]}
    s = {"dirs": dirs, "sha": dict(files), "isdir": [], "manifest": manifest}
    if bad is not None:
        s["manifest_bad"] = bad
    return s


def _plan(monkeypatch, survey):
    monkeypatch.setattr(deploy, "survey", lambda port, paths, dirs: survey)
    want = {"/finetune.mpy": ("finetune.mpy", SHA_NEW, "entry point"),
            "/data/iris.csv": ("iris.csv", SHA_NEW, "data file"),
            deploy.LIB_DIR + "/dense.mpy": ("dense.mpy", SHA_NEW, "module")}
    said = []
    plan = deploy.plan_deploy(None, want, {}, None, "keep", False, said.append)
    return plan, said


def _renamed(plan):
    return {op[1]: op[2] for op in plan.ops if op[0] == "rename"}


def test_users_files_are_kept_deploys_own_replaced(monkeypatch):
    files = {"/finetune.mpy": SHA_USER,                 # deploy wrote SHA_OLD there; edited since
             "/data/iris.csv": SHA_USER,                # never deploy's
             deploy.LIB_DIR + "/dense.mpy": SHA_OLD}    # deploy's, unchanged: replaced
    manifest = json.dumps({"version": 1, "files": {"/finetune.mpy": SHA_OLD,
                                                   deploy.LIB_DIR + "/dense.mpy": SHA_OLD}})
    plan, said = _plan(monkeypatch, _survey(files, manifest))
    assert _renamed(plan) == {"/finetune.mpy": "/finetune.mpy.bak", "/data/iris.csv": "/data/iris.csv.bak"}
    assert sorted(p for _, p in plan.copies) == sorted(files)
    assert not [op for op in plan.ops if op[0] == "remove"]
    assert any(n.startswith("KEPT /finetune.mpy as /finetune.mpy.bak") for n in plan.notes), plan.notes


@pytest.mark.parametrize("bad, text", [
    ("not UTF-8 text", None),
    ("2000000 bytes, more than the %d a manifest may have" % deploy.MANIFEST_MAX, None),
    (None, "{" + " " * deploy.MANIFEST_MAX + "}"),          # past the bound on the host too
    (None, "[1, 2]"),
])
def test_an_unreadable_manifest_counts_as_absent(monkeypatch, bad, text):
    files = {"/finetune.mpy": SHA_OLD, "/data/iris.csv": SHA_USER, deploy.LIB_DIR + "/dense.mpy": SHA_OLD}
    plan, said = _plan(monkeypatch, _survey(files, text, bad, ["finetune.mpy", "data/", "lib/",
                                                                ".microformer-deploy.json"]))
    # nothing deploy cannot prove it wrote is overwritten: every file in its way becomes .bak
    assert _renamed(plan) == dict((p, p + ".bak") for p in files), plan.ops
    assert not plan.legacy
    assert any(deploy.MANIFEST in s and "counts as absent" in s for s in said), said


def test_a_manifest_that_is_a_folder_is_kept_aside(monkeypatch):
    files = {"/finetune.mpy": SHA_OLD}
    plan, said = _plan(monkeypatch, _survey(files, None, "a folder", ["finetune.mpy", ".microformer-deploy.json/"]))
    ren = _renamed(plan)
    assert ren[deploy.MANIFEST] == deploy.MANIFEST + ".bak", plan.ops
    assert ren["/finetune.mpy"] == "/finetune.mpy.bak"
    assert plan.old_manifest_text is None           # the new manifest gets written


def test_a_full_deploys_manifest_is_well_within_the_bound():
    # every module, entry point, golden file, a data file and the checkpoint, as deploy lists them
    import os
    import helpers
    names = [deploy.LIB_DIR + "/" + f[:-3] + ".mpy" for f in os.listdir(os.path.join(helpers.LIB, "microformer"))
             if f.endswith(".py")]
    names += ["/" + f[:-3] + ".mpy" for d in helpers.BOARD_PATH for f in os.listdir(d) if f.endswith(".py")]
    names += ["/golden/" + f for f in os.listdir(os.path.join(helpers.TESTS, "golden"))]
    names += ["/data/iris.csv", deploy.BOARD_CHECKPOINT]
    text = json.dumps({"version": 1, "files": dict((n, "ab" * 32) for n in names)}, indent=1, sort_keys=True)
    assert 3 * len(text) < deploy.MANIFEST_MAX, (len(text), deploy.MANIFEST_MAX)
