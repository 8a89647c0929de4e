"""make deploy: precompile lib/microformer and board/ (session, demos/, bench/) for the board's architecture and copy
them, the data and your checkpoint to the board's flash.

    python host/tools/deploy.py [--port /dev/ttyACM0] [--checkpoint build/mine.mfck] [--data "a.csv b.csv"] [--force]

Without --port (or PORT) the virtual board is the target, started when needed.

Where things go: lib/microformer/*.py as .mpy to /lib/microformer/, board/*.py, board/demos/*.py and board/benchmarks/*.py as .mpy to the
flash root (import finetune, import iris, ... work by name; .mpy files carry no docstrings, so the
REPL entry points print their help from strings), the data to /data/, the golden vectors to
/golden/, and the checkpoint to /model.mfck, which finetune.Session() opens.

Deploy owns only what it wrote. It keeps a manifest on the board, /.microformer-deploy.json, of
every file it put there with its SHA-256, and changes a board file only when it wrote that file
and the file is unchanged since (or already holds the bytes being sent). Anything else in its way,
your own /sensor.py, an edited /finetune.py, a row you appended to /data/iris.csv, a checkpoint
saved on the board, is renamed to NAME.bak (.bak2, ...: a board may have no clock) and deploy
says so, file by file. --force (make deploy FORCE=1) replaces or removes such files without
keeping a copy. In detail:
- a NAME.py next to a deployed NAME.mpy would be imported instead of it (MicroPython prefers .py):
  removed when it holds exactly this checkout's source (e.g. from `mpremote mip install`),
  otherwise kept as NAME.py.bak;
- a file in /lib/microformer that deploy wrote and this version no longer ships is removed; one
  deploy did not write (your own mylayer.py) is left where it is, and deploy lists it;
- a /model.mfck.tmp (a save interrupted by a power cut: with no /model.mfck the session loads it)
  is never buried: it is renamed to /model.mfck.bak (.bak2, ...) when it is a complete checkpoint,
  to /model.mfck.tmp.bak when it is not, and deploy says which.
A second deploy with nothing changed writes nothing.
"""
import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from board_link import ROOT, board_files, board_lib_files, board_mpy, mpremote, resolve_port, tool  # noqa: E402


def viper_generator():
    """host/viper/gen_viper.py as the module gen_viper, loaded by its path: its folder (the viper
    templates, read as text) stays off sys.path."""
    if "gen_viper" not in sys.modules:
        spec = importlib.util.spec_from_file_location("gen_viper", ROOT / "host" / "viper" / "gen_viper.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["gen_viper"] = module
        spec.loader.exec_module(module)
    return sys.modules["gen_viper"]


_VIPER_MODULES = viper_generator().MODULES

# where deploy compiles what it copies (emptied and refilled on every deploy); MF_DEPLOY_BUILD
# names another folder, so that two deploys running at once (a test suite on several workers)
# do not copy files from under each other
BUILD = Path(os.environ.get("MF_DEPLOY_BUILD") or ROOT / "build" / "deploy")
DATASETS = ROOT / "datasets"
# the viper kernel namespace and the generated modules it gathers (native code)
VIPER_FILES = ("kernels_viper.py",) + tuple("viper_%s.py" % n for n in _VIPER_MODULES)

MANIFEST = "/.microformer-deploy.json"
MANIFEST_MAX = 32768                    # bytes: a full deploy's manifest is about 8 KB
BOARD_CHECKPOINT = "/model.mfck"        # what finetune.Session() opens
LIB_DIR = "/lib/microformer"
LEGACY_CHECKPOINT = "/iris.mfck"       # where deploys before the manifest put the checkpoint
NATIVE_MODULE = "/lib/mf_native.mpy"   # the C kernels (make native), with --native (make deploy NATIVE=1)


def native_module(arch):
    """build/native/<arch>/mf_native.mpy, the C kernels built for the board's architecture; stops
    with what to run when it is not built."""
    path = ROOT / "build" / "native" / str(arch) / "mf_native.mpy"
    if not arch:
        raise SystemExit("deploy --native: the board runs no native code (sys.implementation._mpy names no "
                         "architecture); deploy without NATIVE=1")
    if not path.is_file():
        raise SystemExit("deploy --native: %s is missing: build it with `make native NATIVE_ARCHS=%s`"
                         % (path.relative_to(ROOT), arch))
    return path


def _mpy_cross(arch, src, name, out):
    # -s: tracebacks on the board name the source file (e.g. microformer/x.py), not this machine's path
    cmd = [tool("mpy-cross")] + (["-march=" + arch] if arch else []) + ["-s", name, "-o", str(out), str(src)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit("mpy-cross failed on %s:\n%s" % (src, r.stderr))


def compile_board(arch, build=None):
    """board/*.py, board/demos/*.py, board/benchmarks/*.py -> build/deploy/<arch>/board/*.mpy, in one
    folder as on the board (`build`: another folder than BUILD); returns the .mpy files."""
    out = Path(build or BUILD) / (arch or "bytecode") / "board"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    files = []
    for src in board_files():
        _mpy_cross(arch, src, src.name, out / (src.stem + ".mpy"))
        files.append(out / (src.stem + ".mpy"))
    return files


def compile_lib(arch, build=None):
    """lib/microformer/*.py -> build/deploy/<arch>/lib/microformer/*.mpy (`build`: another folder
    than BUILD); returns that lib folder."""
    out = Path(build or BUILD) / (arch or "bytecode") / "lib" / "microformer"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for src in board_lib_files():
        if arch is None and src.name in VIPER_FILES:
            continue   # a port without native code cannot load viper kernels
        _mpy_cross(arch, src, "microformer/" + src.name, out / (src.stem + ".mpy"))
    return out


def sha256_file(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


# Runs on the board first: what is there. %(paths)r: files to hash; %(dirs)r: folders to list
# (every file of LIB_DIR is hashed too). Prints one line 'SURVEY {json}'.
SURVEY = """import os, json, hashlib, binascii, gc
gc.collect()
def _sha(p):
    h = hashlib.sha256()
    b = bytearray(512)
    with open(p, 'rb') as f:
        while True:
            n = f.readinto(b)
            if not n:
                break
            h.update(b[:n])
    return binascii.hexlify(h.digest()).decode()
r = {'dirs': {}, 'sha': {}, 'isdir': [], 'manifest': None}
for d in %(dirs)r:
    try:
        r['dirs'][d] = [e[0] + ('/' if e[1] == 0x4000 else '') for e in os.ilistdir(d)]
    except OSError:
        r['dirs'][d] = None
paths = %(paths)r + [%(lib)r + '/' + n for n in (r['dirs'][%(lib)r] or ()) if n[-1:] != '/']
for p in paths:
    try:
        st = os.stat(p)
    except OSError:
        continue
    if st[0] & 0x4000:
        r['isdir'].append(p)
    else:
        r['sha'][p] = _sha(p)
# the manifest, read defensively: a folder, more than %(max)d bytes or bytes that are not UTF-8
# are reported (manifest_bad), never read whole nor decoded into an error
try:
    st = os.stat(%(manifest)r)
except OSError:
    st = None
if st is not None:
    if st[0] & 0x4000:
        r['manifest_bad'] = 'a folder'
    elif st[6] > %(max)d:
        r['manifest_bad'] = str(st[6]) + ' bytes, more than the %(max)d a manifest may have'
    else:
        try:
            gc.collect()
            with open(%(manifest)r, 'rb') as f:
                r['manifest'] = f.read(st[6]).decode()   # its own size: one buffer of %(max)d would not fit a busy heap
        except UnicodeError:
            r['manifest_bad'] = 'not UTF-8 text'
        except OSError as e:
            r['manifest_bad'] = 'unreadable (' + str(e) + ')'
print('SURVEY', json.dumps(r))
"""

# Runs on the board before the copies: %(ops)r is a list of ('mkdir', d), ('rename', a, b),
# ('remove', p). Each op prints a line; a failure stops the deploy before anything is copied.
APPLY = """import os
for op in %(ops)r:
    if op[0] == 'mkdir':
        try:
            os.mkdir(op[1])
        except OSError:
            os.stat(op[1])
    elif op[0] == 'rename':
        os.rename(op[1], op[2])
    else:
        os.remove(op[1])
    print('DONE', ' '.join(op))
"""

# Writes the manifest: NAME.tmp, then renamed over NAME (FAT refuses to rename over a file:
# there the old one is removed first; a lost manifest only makes the next deploy keep more .bak).
WRITE_MANIFEST = """import os
n = %(name)r
with open(n + '.tmp', 'w') as f:
    f.write(%(text)r)
try:
    os.rename(n + '.tmp', n)
except OSError:
    try:
        os.remove(n)
    except OSError:
        pass
    os.rename(n + '.tmp', n)
print('MANIFEST written')
"""


def _dirname(p):
    return p.rsplit("/", 1)[0] or "/"


def _basename(p):
    return p.rsplit("/", 1)[1]


def _parents(p):
    """'/a/b/c.py' -> ['/a', '/a/b']."""
    parts = p.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[:i + 1]) for i in range(len(parts))]


def survey(port, paths, dirs):
    out = mpremote(port, "exec", survey_code(paths, dirs), timeout=300)
    for line in out.splitlines():
        if line.startswith("SURVEY "):
            return json.loads(line[len("SURVEY "):])
    raise SystemExit("deploy: the board did not report its files:\n" + out)


def survey_code(paths, dirs):
    """The survey the board runs (SURVEY with its paths filled in)."""
    return SURVEY % {"paths": sorted(paths), "dirs": sorted(dirs), "lib": LIB_DIR, "manifest": MANIFEST,
                     "max": MANIFEST_MAX}


def read_manifest(text, say, bad=None):
    """{board path: sha256} from the manifest's text (None: none on the board). bad: why the
    board could not read it (the survey's manifest_bad). A manifest deploy cannot read or use
    counts as absent, and then nothing on the board is deploy's: {} (every file in the way is
    kept as .bak)."""
    if bad is None and text is None:
        return None
    try:
        if bad is not None:
            raise ValueError(bad)
        if len(text) > MANIFEST_MAX:
            raise ValueError("%d characters, more than the %d a manifest may have" % (len(text), MANIFEST_MAX))
        m = json.loads(text)
        if not isinstance(m, dict):
            raise ValueError("a JSON object with 'files', got %s" % type(m).__name__)
        files = m["files"]
        if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
            raise ValueError("'files' must map board paths to SHA-256 strings")
        return dict(files)
    except (ValueError, KeyError, TypeError) as e:
        say("the board's %s is not a deploy manifest deploy can read (%s): it counts as absent, and "
            "every file on the board counts as yours this time (kept as .bak when in the way)" % (MANIFEST, e))
        return {}


def _checkpoint_module():
    """microformer.checkpoint from this checkout's lib/ (the host verifies checkpoints with it)."""
    if str(ROOT / "lib") not in sys.path:
        sys.path.insert(0, str(ROOT / "lib"))
    from microformer import checkpoint
    return checkpoint


def check_checkpoint(path):
    """The metadata of the checkpoint at `path` (a host file), after verifying it; SystemExit naming
    the file when it is missing or not a valid checkpoint."""
    checkpoint = _checkpoint_module()
    p = Path(path)
    if not p.exists():
        raise SystemExit("CHECKPOINT %s: no such file (deploy copies your checkpoint, it never makes one; "
                         "`make pretrain` writes the project's build/iris.mfck)" % path)
    if p.is_dir():
        raise SystemExit("CHECKPOINT %s is a folder, expected a checkpoint file (.mfck)" % path)
    try:
        return checkpoint.read_header(str(p)).get("meta") or {}
    except (ValueError, OSError) as e:
        raise SystemExit("CHECKPOINT %s is not a loadable checkpoint: %s" % (path, e))


def resolve_data(items, checkpoint=None, meta=None, say=print):
    """Host files to copy to /data/: `items` (names in datasets/ or paths) when given (a list, possibly
    empty); None: the base data file the checkpoint's meta names (meta['data']), looked up next to
    the checkpoint, then in datasets/, else none. Says which."""
    data_name = (meta or {}).get("data")
    if items is None:
        if checkpoint is None:
            return []
        if not data_name:
            say("data: the checkpoint's metadata names no base data file (meta['data']): none copied "
                "(DATA=path/or/name.csv copies one)")
            return []
        places = [Path(checkpoint).resolve().parent / data_name, DATASETS / data_name]
        for p in places:
            if p.is_file():
                say("data: %s (the base data the checkpoint's meta names) -> :/data/%s" % (p, data_name))
                return [p]
        say("data: the checkpoint's meta names %r as its base data, but neither %s exists: none copied "
            "(DATA=path/to/%s copies it)" % (data_name, " nor ".join(str(p) for p in places), data_name))
        return []
    files = []
    for item in items:
        p = Path(item)
        if p.is_file():
            files.append(p)
        elif (DATASETS / item).is_file():
            files.append(DATASETS / item)
        else:
            raise SystemExit("DATA %s: no such file (tried %s and %s; datasets/ has: %s)" % (
                item, p, DATASETS / item, ", ".join(sorted(q.name for q in DATASETS.glob("*.csv")))))
    for f in files:
        say("data: %s -> :/data/%s" % (f, f.name))
    if data_name and checkpoint is not None and data_name not in [f.name for f in files]:
        say("data: note: the checkpoint's meta names %r as its base data; finetune.Session() reads "
            "data/%s" % (data_name, data_name))
    return files


def _tmp_is_complete(port, board_path):
    """(True, '') when the board's file is a complete, loadable checkpoint, else (False, why)."""
    checkpoint = _checkpoint_module()
    with tempfile.TemporaryDirectory() as d:
        local = Path(d) / "board.mfck"
        mpremote(port, "cp", ":" + board_path, str(local), timeout=300)
        try:
            checkpoint.read_header(str(local))
            return True, ""
        except (ValueError, OSError) as e:
            return False, str(e).replace(str(local), board_path)


class Plan:
    """What deploy will do to the board, decided on the host from the board's survey."""

    def __init__(self, survey, manifest, record):
        self.files = survey["sha"]      # {board path: sha256} as the board has them
        self.dirs = survey["dirs"]      # {board folder: [names] or None}
        self.manifest = manifest        # {board path: sha256} deploy wrote, or None (no manifest)
        self.record = record            # {board path: sha256} from an older deploy's .deployed record
        # a board deployed before the manifest existed
        self.legacy = manifest is None and any(
            r in self.files for r in (LEGACY_CHECKPOINT + ".deployed", BOARD_CHECKPOINT + ".deployed"))
        self.ops = []                   # APPLY's ops
        self.copies = []                # (host file, board path)
        self.notes = []                 # what deploy tells the user
        self.owned = {}                 # the new manifest
        self._taken = set()             # names this plan creates

    def exists(self, p):
        names = self.dirs.get(_dirname(p))
        return p in self._taken or p in self.files or bool(names and (
            _basename(p) in names or _basename(p) + "/" in names))

    def bak(self, p):
        k, i = p + ".bak", 2
        while self.exists(k):
            k, i = "%s.bak%d" % (p, i), i + 1
        self._taken.add(k)
        return k

    def wrote(self, p, sha):
        """Did deploy write this content at p (and nothing changed it since)?"""
        if sha is None:
            return False
        if (self.manifest or {}).get(p) == sha or self.record.get(p) == sha:
            return True
        # before the manifest: compiled modules and golden vectors at deploy's own paths were deploy's
        return self.legacy and (p.endswith(".mpy") or p.startswith("/golden/"))

    def why(self, p):
        return ("changed on the board since deploy wrote it" if p in (self.manifest or {}) or p in self.record
                else "not written by deploy")

    def keep_aside(self, p, why, force):
        """p (the user's, or changed since deploy wrote it) is in the way: .bak it, or drop it if force."""
        if force:
            self.ops.append(("remove", p))
            self.notes.append("FORCE: removed %s (%s) without keeping a copy" % (p, why))
            return None
        k = self.bak(p)
        self.ops.append(("rename", p, k))
        self.notes.append("KEPT %s as %s: %s" % (p, k, why))
        return k

    def place(self, local, p, sha, force, what="file"):
        """Copy host file `local` to board path p unless it holds those bytes already."""
        cur = self.files.get(p)
        self.owned[p] = sha
        if cur == sha:
            return "same"
        if cur is None:
            self.copies.append((local, p))
            return "new"
        if self.wrote(p, cur):
            self.copies.append((local, p))
            return "replaced"
        self.keep_aside(p, "your %s, %s" % (what, self.why(p)), force)
        self.copies.append((local, p))
        return "forced" if force else "kept"


def plan_deploy(port, want, shadows, checkpoint_path, checkpoint_mode, force, say):
    """want: {board path: (host file, sha256, what)}; shadows: {board path of a NAME.py that would
    shadow a deployed NAME.mpy: sha256 of this checkout's NAME.py}."""
    want = dict(want)
    paths = set(want) | set(shadows) | {LEGACY_CHECKPOINT, LEGACY_CHECKPOINT + ".deployed"}
    if checkpoint_path:
        paths |= {checkpoint_path + ".tmp", checkpoint_path + ".deployed"}
    dirs = {d for p in paths for d in _parents(p)} | {"/", LIB_DIR}
    s = survey(port, paths, dirs)
    for p in s["isdir"]:
        if p in want or p in shadows:
            raise SystemExit("deploy: the board has a folder at %s, where deploy puts a file: rename or "
                             "remove it (mpremote fs ...)" % p)
    manifest = read_manifest(s["manifest"], say, s.get("manifest_bad"))
    record = {}
    rec_path = (checkpoint_path or BOARD_CHECKPOINT) + ".deployed"
    if rec_path in s["sha"]:
        # the SHA-256 record of deploys before the manifest: what deploy wrote at the checkpoint
        out = mpremote(port, "exec", "print('REC', open(%r).read().strip())" % rec_path)
        rec = [ln.split()[1] for ln in out.splitlines() if ln.startswith("REC ") and len(ln.split()) > 1]
        if rec:
            record[rec_path[:-len(".deployed")]] = rec[0]
    plan = Plan(s, manifest, record)
    plan.old_manifest_text = s["manifest"] if s.get("manifest_bad") is None else None
    if s.get("manifest_bad") == "a folder":          # in the way of the new manifest: kept, never removed
        plan.keep_aside(MANIFEST, "a folder where deploy keeps its manifest", False)
    if plan.legacy:
        say("this board was deployed before deploy kept a manifest: its compiled modules (.mpy) and "
            "golden vectors count as deploy's; every other file in the way is kept as .bak")
    for d in sorted(dirs):
        if s["dirs"].get(d) is None and d != "/":
            plan.ops.append(("mkdir", d))
            plan.dirs[d] = []

    # a NAME.py that would be imported instead of the deployed NAME.mpy
    for p, source_sha in sorted(shadows.items()):
        cur = s["sha"].get(p)
        if cur is None:
            continue
        mpy = p[:-3] + ".mpy"
        if cur == source_sha:
            plan.ops.append(("remove", p))
            plan.notes.append("removed %s: this checkout's own source (e.g. from mip), it would "
                              "shadow %s" % (p, mpy))
        else:
            plan.keep_aside(p, "a %s that is not this checkout's: MicroPython imports it instead of the "
                               "deployed %s (rename it back to use it instead)" % (_basename(p), mpy), force)

    # the checkpoint, and an interrupted save's .tmp next to it
    plan.ck_state = None
    if checkpoint_path:
        local, sha, _ = want.pop(checkpoint_path)
        tmp = checkpoint_path + ".tmp"
        if record:
            plan.ops.append(("remove", rec_path))
            plan.notes.append("folded %s (the checkpoint's SHA-256 record) into %s" % (rec_path, MANIFEST))
        if checkpoint_mode == "missing" and (checkpoint_path in s["sha"] or tmp in s["sha"]):
            if plan.wrote(checkpoint_path, s["sha"].get(checkpoint_path)):
                plan.owned[checkpoint_path] = s["sha"][checkpoint_path]
            plan.ck_state = "present"
        else:
            if tmp in s["sha"]:
                ok, why = _tmp_is_complete(port, tmp)
                if ok:
                    k = plan.bak(checkpoint_path)
                    plan.ops.append(("rename", tmp, k))
                    plan.notes.append("RECOVERED %s, a complete checkpoint left by an interrupted save "
                                      "(a power cut), as %s: finetune.Session(%r) opens it"
                                      % (tmp, k, k.lstrip("/")))
                else:
                    k = plan.bak(tmp)
                    plan.ops.append(("rename", tmp, k))
                    plan.notes.append("KEPT %s as %s: an interrupted save, not loadable (%s)" % (tmp, k, why))
            plan.ck_state = plan.place(local, checkpoint_path, sha, force, "checkpoint")

    for p in sorted(want):
        local, sha, what = want[p]
        plan.place(local, p, sha, force, what)

    # files in /lib/microformer that this deploy does not ship
    for n in sorted(s["dirs"].get(LIB_DIR) or ()):
        p = LIB_DIR + "/" + n
        if n.endswith("/") or p in plan.owned or p in shadows:
            continue
        if plan.wrote(p, s["sha"].get(p)):
            plan.ops.append(("remove", p))
            plan.notes.append("removed stale %s (deploy wrote it; this version has no such module)" % p)
        else:
            plan.notes.append("left %s where it is: %s" % (p, plan.why(p)))
    # the rest of the old manifest: entry points deploy wrote and no longer ships go; data,
    # checkpoints and files it wrote elsewhere stay on the board and in the manifest
    for p, sha in sorted((manifest or {}).items()):
        if p in plan.owned or p.startswith(LIB_DIR + "/") or s["sha"].get(p) != sha:
            continue
        if p.endswith(".mpy") and _dirname(p) == "/":
            plan.ops.append(("remove", p))
            plan.notes.append("removed stale %s (deploy wrote it; this version has no such entry point)" % p)
        else:
            plan.owned[p] = sha
    return plan


def checkpoint_report(state, local, name):
    where = name.lstrip("/")
    opens = ("open it on the board: import finetune; s = finetune.Session()" if name == BOARD_CHECKPOINT
             else "open it on the board: import finetune; s = finetune.Session(%r)" % where)
    return {"new": "checkpoint: copied %s to :%s; %s" % (local, name, opens),
            "same": "checkpoint: :%s already holds %s; %s" % (name, local, opens),
            "replaced": "checkpoint: copied %s to :%s (the one there was deploy's, unchanged); %s"
                        % (local, name, opens),
            "kept": "checkpoint: copied %s to :%s (the board's own is kept, see KEPT above); %s"
                    % (local, name, opens),
            "forced": "checkpoint: FORCE: copied %s to :%s over the board's own; %s" % (local, name, opens),
            "present": "checkpoint: left the board's :%s as it is (it has one)" % name}[state]


def deploy(port, checkpoint=None, data=None, force=False, checkpoint_mode=None, extra=(), say=print,
           native=False):
    """Copy the package, board/*.py, data, the golden vectors and `checkpoint` (to /model.mfck),
    owning only what deploy wrote (see the module's docstring). Returns the report and the board's
    output as one text.

    data: names in datasets/ or host paths, copied to /data/; None: the base data file the
    checkpoint's meta names, when it is found (next to the checkpoint or in datasets/).
    checkpoint_mode: 'keep' (default), 'force' (as force=True) or 'missing' (copy only when the
    board has no checkpoint). extra: more (host file, board path) pairs, e.g. the demo's checkpoint.
    native: also copy the C kernels built for the board's architecture to /lib/mf_native.mpy.
    """
    lines = []

    def tell(s):
        lines.append(s)
        say(s)

    meta = check_checkpoint(checkpoint) if checkpoint else None
    data_files = resolve_data(None if data is None else list(data), checkpoint, meta, tell)
    mpy, _, arch = board_mpy(port)
    if mpy != 6:
        raise SystemExit("the board loads .mpy version %d; this mpy-cross writes version 6 "
                         "(MicroPython >= 1.23): update the firmware (make flash)" % mpy)
    native_path = native_module(arch) if native else None
    libdir = compile_lib(arch)
    entries = compile_board(arch)
    tell("deploying %d modules and %d REPL entry points compiled for %s"
         % (len(list(libdir.iterdir())), len(entries), arch or "bytecode (no native emitter)"))
    force = force or checkpoint_mode == "force"
    want = {}

    def add(local, p, what):
        want[p] = (str(local), sha256_file(local), what)

    for f in sorted(libdir.iterdir()):
        add(f, LIB_DIR + "/" + f.name, "module")
    for f in entries:
        add(f, "/" + f.name, "entry point")
    for f in data_files:
        add(f, "/data/" + f.name, "data file")
    for g in sorted((ROOT / "tests" / "golden").glob("*.mfg")):   # golden vectors for selftest.py
        add(g, "/golden/" + g.name, "golden vectors")
    for local, remote in extra:
        add(local, remote, "file")
    if native_path:
        add(native_path, NATIVE_MODULE, "native module")
    if checkpoint:
        add(checkpoint, BOARD_CHECKPOINT, "checkpoint")
    shadows = {}
    for src in board_lib_files():
        if (libdir / (src.stem + ".mpy")).exists():
            shadows[LIB_DIR + "/" + src.name] = sha256_file(src)
    for src in board_files():
        shadows["/" + src.name] = sha256_file(src)

    plan = plan_deploy(port, want, shadows, BOARD_CHECKPOINT if checkpoint else None,
                       checkpoint_mode or "keep", force, tell)
    text = json.dumps({"version": 1, "files": plan.owned}, indent=1, sort_keys=True) + "\n"
    if len(text.encode()) > MANIFEST_MAX:       # the next survey would not read it: stop first
        raise SystemExit("deploy: the manifest would be %d bytes, more than the %d a board's survey reads "
                         "(MANIFEST_MAX); nothing was changed on the board" % (len(text.encode()), MANIFEST_MAX))
    args = []
    if plan.ops:
        args += ["exec", APPLY % {"ops": plan.ops}, "+"]
    for local, remote in plan.copies:
        args += ["cp", local, ":" + remote, "+"]
    if text != plan.old_manifest_text:
        args += ["exec", WRITE_MANIFEST % {"name": MANIFEST, "text": text}, "+"]
    args += ["exec", "import microformer\nprint('microformer', microformer.__version__, 'backends:', "
                     "microformer.available_backends(), 'default:', microformer.get_backend(), "
                     "'-', microformer.backend.why)"]
    out = mpremote(port, *args, timeout=300)
    board = [ln for ln in out.splitlines() if not ln.startswith("DONE ")]
    for n in plan.notes:
        tell(n)
    tell("copied %d files, %s" % (len(plan.copies), "wrote the manifest " + MANIFEST
                                   if "MANIFEST written" in out else "nothing else changed"))
    if plan.ck_state:
        tell(checkpoint_report(plan.ck_state, checkpoint, BOARD_CHECKPOINT))
    if LEGACY_CHECKPOINT in plan.files and plan.files.get(LEGACY_CHECKPOINT) is not None and checkpoint:
        tell("note: the board also has %s (where older deploys put the checkpoint), left as it is; "
             "finetune.Session('iris.mfck') opens it" % LEGACY_CHECKPOINT)
    rest = "\n".join(ln for ln in board if ln.strip() and ln != "MANIFEST written")
    if rest:
        say(rest)
    return "\n".join(lines + [rest])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", default=None, help="serial port of a board; empty: the virtual board")
    ap.add_argument("--heap", default=None, help="virtual board heap when it has to be started")
    ap.add_argument("--checkpoint", default=None, help="your checkpoint; copied to the board's /model.mfck")
    ap.add_argument("--data", default=None,
                    help="data files for :/data/: names in datasets/ or paths (space separated); "
                         "default: the base data the checkpoint's meta names")
    ap.add_argument("--force", action="store_true",
                    help="replace or remove board files deploy did not write (or that changed since) "
                         "without keeping a .bak copy")
    ap.add_argument("--native", action="store_true",
                    help="also copy the C kernels built for the board's architecture (make native) to "
                         + NATIVE_MODULE)
    a = ap.parse_args(argv)
    # a missing or damaged checkpoint, or a data file that is not there, stops here, before the board
    meta = check_checkpoint(a.checkpoint) if a.checkpoint else None
    data = None if a.data is None else a.data.replace(",", " ").split()
    if data is not None:
        resolve_data(data, a.checkpoint, meta, say=lambda s: None)
    port = resolve_port(a.port, a.heap)
    deploy(port, a.checkpoint, data, force=a.force, native=a.native)


if __name__ == "__main__":
    main()
