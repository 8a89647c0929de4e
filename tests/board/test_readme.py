"""The code blocks of the READMEs are run, so the documentation cannot drift from the code.

DOCS are README.md and the READMEs next to what they document. Every fenced block in them carries a marker on the line before its opening fence:
    <!-- run: cpython micropython -->   run it there (any of cpython, micropython, board, shell, user)
    <!-- run: board exact -->           ... and compare a transcript's output lines exactly
    <!-- no-run: why it is not run -->  not run, and the reason says why
A block with no marker fails test_every_block_is_marked, so a new block cannot escape. Every
relative link in them must lead to a file that exists, and a #fragment to a heading of it
(test_links_resolve).

How a block runs: `cpython` as a script under this Python, `micropython` under each MicroPython
interpreter (the stock port and the 32-bit port), both with lib/ and board/ importable and a fresh
folder as the working directory; `board` with `mpremote run` on a virtual board where `make deploy`
has put the pretrained Iris checkpoint; `shell` through `bash -eu` in the project folder with
.venv/bin first on PATH; `user` is a new user's session across torch, the shell and the board
(the From PyTorch steps: see _user_story). A block whose lines start with `>>> ` is a REPL transcript: each `>>> `
line (with its `... ` continuation lines) runs in turn as the REPL runs it (an expression's value
is echoed), and the first output line the README shows after it must match the first line it
printed: loosely by default (every number may differ: timings, accuracies), exactly with `exact`.
A step the README shows without output is not checked.
"""
import os
import re
import subprocess
import sys

import pytest

import helpers

DOCS = ("README.md", "lib/README.md", "board/README.md", "host/README.md", "tests/README.md")
KINDS = ("cpython", "micropython", "board", "shell", "user")
FENCE = re.compile(r"^ {0,3}(```+|~~~+)(.*)$")
MARKER = re.compile(r"^<!--\s*(run|no-run):(.*?)-->\s*$")
NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


class Block:
    def __init__(self, line, info, lines, marker, doc="README.md"):
        self.line, self.info, self.lines, self.marker = line, info, lines, marker
        self.doc = doc
        self.kinds, self.exact, self.problem = (), False, None
        if marker is None:
            self.problem = "no marker: put <!-- run: KIND --> (%s) or <!-- no-run: reason --> before it" % (
                ", ".join(KINDS))
            return
        what, rest = marker.group(1), marker.group(2).strip()
        if what == "no-run":
            if not rest:
                self.problem = "<!-- no-run: --> needs a reason"
            return
        words = rest.replace(",", " ").split()
        self.exact = "exact" in words
        self.kinds = tuple(w for w in words if w != "exact")
        bad = [w for w in self.kinds if w not in KINDS]
        if bad or not self.kinds:
            self.problem = "<!-- run: %s -->: expected one or more of %s (and optionally 'exact'), got %r" % (
                rest, ", ".join(KINDS), bad or rest)

    @property
    def text(self):
        return "\n".join(self.lines) + "\n"

    def is_transcript(self):
        return any(l.startswith(">>> ") or l == ">>>" for l in self.lines)

    def steps(self):
        """[(source, expected output lines)] of a REPL transcript."""
        out = []
        for l in self.lines:
            if l.startswith(">>> ") or l == ">>>":
                out.append([l[4:], []])
            elif l.startswith("... ") and out and not out[-1][1]:
                out[-1][0] += "\n" + l[4:]
            elif out:
                out[-1][1].append(l)
            elif l.strip():
                raise ValueError("%s line %d: %r comes before the first '>>> '" % (self.doc, self.line, l))
        return [(src, want) for src, want in out]


def blocks(text, doc="README.md"):
    """The fenced blocks of a Markdown text, each with the marker on the line before its fence."""
    found, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, start = m.group(1), i
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        if j == len(lines):
            raise ValueError("%s line %d: the block opened here is never closed" % (doc, start + 1))
        before = start - 1
        while before >= 0 and not lines[before].strip():
            before -= 1
        marker = MARKER.match(lines[before].strip()) if before >= 0 else None
        found.append(Block(start + 1, m.group(2).strip(), lines[start + 1:j], marker, doc))
        i = j + 1
    return found


def loose(line):
    return " ".join(NUMBER.sub("N", line).split())


def check_transcript(block, output):
    """Compare each step's first expected line with the first line that step printed."""
    parts = re.split(r"^--- readme step (\d+) ---$", output.replace("\r", ""), flags=re.M)
    printed = {int(parts[k]): parts[k + 1].strip("\n").splitlines() for k in range(1, len(parts) - 1, 2)}
    problems = []
    for n, (src, want) in enumerate(block.steps()):
        if n not in printed:
            problems.append(">>> %s: never ran" % src)
            continue
        want = [w for w in want if w.strip()]
        if not want:
            continue
        got = printed[n][0] if printed[n] else ""
        same = got.strip() == want[0].strip() if block.exact else loose(got) == loose(want[0])
        if not same:
            problems.append(">>> %s\n  README: %s\n  ran:    %s" % (src, want[0], got))
    assert not problems, "%s line %d: the transcript differs (%s):\n%s" % (
        block.doc, block.line, "exactly" if block.exact else "numbers aside", "\n".join(problems))


def program(block):
    """The block as a script: itself, or a transcript's steps driven by readme_run_mp.run."""
    if not block.is_transcript():
        return block.text
    with open(helpers.script("readme_run_mp.py")) as f:
        return f.read() + "\nrun(%r)\n" % ([src for src, _ in block.steps()],)


def _read(doc):
    with open(os.path.join(helpers.ROOT, doc), encoding="utf-8") as f:
        return f.read()


def _all_blocks():
    return [b for doc in DOCS for b in blocks(_read(doc), doc)]


def _params():
    out = []
    for b in _all_blocks():
        where = "%s-line%d" % (b.doc.replace("/README.md", "").replace(".md", ""), b.line)
        for kind in b.kinds:
            if kind == "micropython":
                for name in helpers.interpreters():
                    out.append(pytest.param(b, kind, name, id="%s-%s-%s" % (where, kind, name),
                                            marks=[pytest.mark.mp32] if name == "mp32" else []))
            else:
                out.append(pytest.param(b, kind, None, id="%s-%s" % (where, kind),
                                        marks=[pytest.mark.board] if kind in ("board", "user") else []))
    return out


@pytest.mark.parametrize("doc", DOCS)
def test_every_block_is_marked(doc):
    found = blocks(_read(doc), doc)
    assert found, "no code blocks found in %s" % doc
    bad = ["line %d: %s" % (b.line, b.problem) for b in found if b.problem]
    assert not bad, "%s blocks:\n" % doc + "\n".join(bad)


# ---- links between the documents ------------------------------------------------------------------

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(text):
    """The #fragments GitHub gives a Markdown text's headings (outside code blocks)."""
    out, seen, fenced = set(), {}, None
    for line in text.splitlines():
        m = FENCE.match(line)
        if m:
            fenced = None if fenced and m.group(1).startswith(fenced) else (fenced or m.group(1))
            continue
        if fenced or not line.startswith("#"):
            continue
        title = line.lstrip("#").strip().lower()
        slug = re.sub(r"[^\w\- ]", "", title).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else "%s-%d" % (slug, n))
    return out


def broken_links(text, doc, root):
    """[(target, why)] for every relative link of `text` (the file `doc` under `root`) that leads
    nowhere: a missing file, or a #fragment that is not a heading of the file it names."""
    bad, fenced = [], None
    for line in text.splitlines():
        m = FENCE.match(line)
        if m:
            fenced = None if fenced and m.group(1).startswith(fenced) else (fenced or m.group(1))
            continue
        if fenced:
            continue
        for target in LINK.findall(line):
            if re.match(r"[a-z]+:", target):
                continue                                   # http(s):, mailto: ...
            path, _, frag = target.partition("#")
            file = os.path.normpath(os.path.join(root, os.path.dirname(doc), path)) if path else \
                os.path.join(root, doc)
            if not os.path.exists(file):
                bad.append((target, "no such file: %s" % os.path.relpath(file, root)))
            elif frag and (not file.endswith(".md") or frag not in anchors(open(file, encoding="utf-8").read())):
                bad.append((target, "no heading #%s in %s" % (frag, os.path.relpath(file, root))))
    return bad


@pytest.mark.parametrize("doc", DOCS + ("CHANGELOG.md",))
def test_links_resolve(doc):
    bad = broken_links(_read(doc), doc, helpers.ROOT)
    assert not bad, "%s: links that lead nowhere:\n" % doc + "\n".join("  %s: %s" % b for b in bad)


def test_link_check_finds_missing_files_and_headings(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "README.md").write_text("# Sub\n## The virtual board, and more\n```\n# not a heading\n```\n")
    text = ("[ok](sub/README.md) [ok](sub/README.md#the-virtual-board-and-more) [ok](#top) "
            "[web](https://example.com/x) [gone](sub/NOPE.md) [bad](sub/README.md#not-a-heading) "
            "[bad](#nowhere)\n# Top\n```\n[in code](nowhere.md)\n```\n")
    (tmp_path / "README.md").write_text(text)
    assert [t for t, _ in broken_links(text, "README.md", str(tmp_path))] == [
        "sub/NOPE.md", "sub/README.md#not-a-heading", "#nowhere"]


@pytest.mark.parametrize("block, kind, interpreter", _params())
def test_readme_block(block, kind, interpreter, tmp_path, request):
    if kind == "user":
        return _user_story(block, tmp_path, request.getfixturevalue("monkeypatch"),
                           request.getfixturevalue("deployed_flash"))
    path = tmp_path / "readme_block.py"
    path.write_text(program(block))
    if kind == "cpython":
        out = helpers.run_cpython(path, cwd=str(tmp_path))
    elif kind == "micropython":
        out = helpers.run_micropython(path, cwd=str(tmp_path), exe=helpers.interpreter_path(interpreter))
    elif kind == "board":
        out = _on_board(path, tmp_path, request.getfixturevalue("iris_checkpoint"),
                        request.getfixturevalue("deployed_flash"))
    else:
        env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
        r = subprocess.run(["bash", "-eu", "-c", block.text], cwd=helpers.ROOT, env=env,
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, "%s line %d failed (rc=%d):\n%s\n%s" % (
            block.doc, block.line, r.returncode, r.stdout[-3000:], r.stderr[-3000:])
        out = r.stdout
    if block.is_transcript():
        check_transcript(block, out)


def _on_board(path, tmp_path, checkpoint, deployed_flash):
    """Run a script on a fresh virtual board after `make deploy` (the pretrained Iris checkpoint;
    the board starts from a copy of a deployed flash, conftest.deployed_flash)."""
    import board_link
    import deploy
    import vboard
    board = vboard.VirtualBoard(tmp_path / "vb", heap=helpers.board_heap())
    deployed_flash(tmp_path / "vb", board.micropython)
    with board as b:
        deploy.deploy(b.port, str(checkpoint))
        return board_link.mpremote(b.port, "run", str(path), timeout=600)     # a failure raises, with the output


# ---- a new user's story: torch, the shell and the board -----------------------------------------

def _comment_after(lines, key):
    """The lines of comment text after `key`: the rest of its comment line, then the comment
    lines that follow it ('#' removed)."""
    for i, line in enumerate(lines):
        if line.lstrip().startswith("#") and key in line:
            out = [line.split(key, 1)[1]]
            for more in lines[i + 1:]:
                if not more.lstrip().startswith("#"):
                    break
                out.append(more.lstrip()[1:])
            return out
    raise AssertionError("the block names no %r in its comments" % key)


def _code_after(lines, key):
    """Python after `key` in the comments: a compound statement (`class GestureNet(nn.Module):`)
    with the comment lines indented under it (by the column its first line starts at), or lines
    (each cut at a '  #' comment) until the brackets balance at a line's end."""
    for i, line in enumerate(lines):
        if line.lstrip().startswith("#") and key in line:
            col = line.index(key) + len(key)
            col += len(line[col:]) - len(line[col:].lstrip())
            first = line[col:].split("  #")[0].rstrip()
            if first.endswith(":"):
                out = [first]
                for more in lines[i + 1:]:
                    head, body = more[:col], more[col:]
                    if not more.lstrip().startswith("#") or head.strip("# ") or not body.startswith(" "):
                        break
                    out.append(body.split("  #")[0].rstrip())
                return "\n".join(out)
            break
    out, depth = [], 0
    for line in _comment_after(lines, key):
        line = line.split("  #")[0].rstrip()
        out.append(line.strip() if not out else "    " + line.strip())
        depth += sum(line.count(o) - line.count(c) for o, c in ("()", "[]", "{}"))
        if depth == 0:
            return "\n".join(out)
    raise AssertionError("the code after %r never closes its brackets" % key)


def _json_after(lines, key):
    """The JSON object after `key` in the comments: from its '{' to the '}' that balances it."""
    text = "\n".join(_comment_after(lines, key))
    start, depth = text.index("{"), 0
    for i in range(start, len(text)):
        depth += (text[i] == "{") - (text[i] == "}")
        if depth == 0:
            return text[start:i + 1]
    raise AssertionError("the JSON after %r never closes" % key)


def _windows(classes, L, C, per_class, seed):
    """Labelled windows [N, L, C] (class k: a sine of its own frequency on every channel)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    X, y = [], []
    for k in range(len(classes)):
        for _ in range(per_class):
            t = np.arange(L)[:, None] + rng.uniform(0, 50)
            X.append(np.sin(2 * np.pi * (0.03 + 0.07 * k) * t) * (1 + np.arange(C)) + rng.normal(0, 0.1, (L, C)))
            y.append(k)
    return np.asarray(X, np.float32), np.asarray(y)


def _user_story(block, tmp_path, monkeypatch, deployed_flash):
    """Run a From PyTorch block as a user would, line by line, in a folder laid out like a checkout
    (links to this one's host/, lib/, board/, datasets/, Makefile, .venv; a build/ of its own),
    holding what the block's comments say the user has: mymodel.py (the `def build()` the comment
    shows), meta.json (the JSON the comment shows), the base data it names (windows of the
    --input-shape, one per class in turn) and `model` (build() trained a little in torch). Comment
    lines are skipped; `>>> ` lines run on a virtual board with the heap the block's `make board-up
    HEAP=...` comment gives (a board with PSRAM; make deploy's); lines starting with python, make
    or mpremote run as typed in bash with .venv/bin first on PATH and PORT= the virtual board;
    any other line is Python on the host, in one namespace.
    Then: the `model` the block ends with computes what the board's saved weights compute."""
    import json
    import numpy as np
    torch = pytest.importorskip("torch") if not os.environ.get("CI") else __import__("torch")
    from torch import nn
    import vboard
    import board_link
    import microformer as mf

    lines = block.lines
    build_src = _code_after(lines, "mymodel.py:")
    meta = json.loads(_json_after(lines, "meta.json:"))
    shape = re.search(r"--input-shape (\d+),(\d+)", block.text)
    assert shape, "the block's torch_io line gives no --input-shape L,C"
    L, C = int(shape.group(1)), int(shape.group(2))
    work = tmp_path / "checkout"
    work.mkdir()
    for name in ("host", "lib", "board", "datasets", "Makefile", "requirements.txt", "requirements-torch.txt", ".venv"):
        os.symlink(os.path.join(helpers.ROOT, name), str(work / name))
    (work / "build").mkdir()
    if os.path.exists(helpers.MP32):
        os.symlink(os.path.dirname(helpers.MP32), str(work / "build" / "mp32"))
    (work / "mymodel.py").write_text("import torch\nfrom torch import nn\n\n\n" + build_src + "\n")
    factory = re.search(r"--model mymodel\.py:(\w+)", block.text)
    assert factory, "the block's torch_io line gives no --model mymodel.py:FACTORY"
    factory = factory.group(1)
    (work / "meta.json").write_text(json.dumps(meta))
    X, y = _windows(meta["classes"], L, C, 10, 0)
    with open(str(work / meta["data"]), "w") as f:
        f.write(",".join("t%d_c%d" % (t, c) for t in range(L) for c in range(C)) + ",label\n")
        for w, k in zip(X, y, strict=True):
            f.write(",".join("%.5g" % v for v in w.reshape(-1)) + "," + meta["classes"][k] + "\n")
    monkeypatch.chdir(str(work))
    monkeypatch.syspath_prepend(str(work))
    import importlib
    import mymodel
    mymodel = importlib.reload(mymodel)
    model = getattr(mymodel, factory)()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    xs = torch.tensor(X).transpose(1, 2)          # the user's module is channels first
    for _ in range(30):
        opt.zero_grad()
        nn.functional.cross_entropy(model(xs), torch.tensor(y)).backward()
        opt.step()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    ns = dict(vars(mymodel), torch=torch, nn=nn, model=model)
    bin_dir = os.path.dirname(sys.executable)
    env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))
    env.pop("MAKEFLAGS", None)
    ran = []
    heap = re.search(r"make board-up HEAP=(\w+)", block.text)
    assert heap, "the block names no `make board-up HEAP=...` for a board without one"
    board = vboard.VirtualBoard(tmp_path / "vb", heap=heap.group(1))
    deployed_flash(tmp_path / "vb", board.micropython)      # the project deployed before (conftest)
    with board as b:      # the block's board-up
        env["PORT"] = str(b.port)
        for line in lines:
            code = line.strip()
            if not code or code.startswith("#"):
                continue
            if code.startswith(">>> "):
                out = board_link.mpremote(str(b.port), "exec", code[4:], timeout=600)
                assert "Traceback" not in out, out
            elif code.split()[0] in ("python", "make", "mpremote"):
                cmd = code                 # as typed: PORT (the environment) names the board
                if cmd.startswith("make "):      # the venv this suite runs in counts as installed
                    cmd = "make --no-print-directory -o .venv/.installed " + cmd[len("make "):]
                r = subprocess.run(["bash", "-eu", "-c", cmd], cwd=str(work), env=env,
                                   capture_output=True, text=True, timeout=600)
                assert r.returncode == 0, "%s line %d: %s failed (rc=%d):\n%s\n%s" % (
                    block.doc, block.line, code, r.returncode, r.stdout[-3000:], r.stderr[-3000:])
            else:
                exec(code, ns)
            ran.append(code)
    assert any(c.startswith(">>> ") for c in ran) and any(c.startswith("make deploy") for c in ran), ran
    # the split the user gave is the checkpoint's, through conversion, deploy and the board's save
    if "split" in meta:
        assert mf.checkpoint.read_header(str(work / "tuned.mfck"))["meta"].get("split") == meta["split"]
    # the module the block ends with holds the board's fine-tuned weights, in the user's layout
    tuned = ns["model"]
    assert any(not torch.equal(start[k], v) for k, v in tuned.state_dict().items()), "nothing was fine-tuned"
    board_model = mf.load_model(str(work / "tuned.mfck")).eval()
    with torch.no_grad():
        got = tuned.eval()(xs[:8]).numpy()
    want = np.asarray(board_model(mf.Tensor.from_list(X[:8].tolist())).data).reshape(got.shape)
    assert float(np.abs(got - want).max()) <= 1e-5 * max(1.0, float(np.abs(want).max())), (got, want)


# ---- the scheme itself, on small texts ------------------------------------------------------------

def test_blocks_need_a_marker_a_known_kind_and_a_reason():
    text = ("<!-- run: cpython micropython -->\n```python\nx = 1\n```\n\n```\nplain\n```\n"
            "<!-- no-run: -->\n```\na\n```\n<!-- run: board, exact -->\n\n```\n>>> 1\n1\n```\n"
            "<!-- run: javascript -->\n```\nb\n```\n<!-- no-run: a list of files -->\n~~~\nc\n~~~\n")
    found = blocks(text)
    assert [b.line for b in found] == [2, 6, 10, 15, 20, 24]
    assert found[0].kinds == ("cpython", "micropython") and found[0].problem is None and found[0].text == "x = 1\n"
    assert found[1].problem.startswith("no marker")
    assert found[2].problem == "<!-- no-run: --> needs a reason"
    assert found[3].kinds == ("board",) and found[3].exact and found[3].problem is None
    assert "javascript" in found[4].problem
    assert found[5].problem is None and found[5].kinds == ()


def test_transcript_steps_and_checks(tmp_path):
    b = blocks("<!-- run: cpython -->\n```\n>>> x = [1,\n...      2]\n>>> sum(x) * 1.5   # a comment\n"
               "total 4.5 in 3 ms\n...\n>>> print('a b')\n>>> None\n```\n")[0]
    assert b.steps() == [("x = [1,\n     2]", []), ("sum(x) * 1.5   # a comment", ["total 4.5 in 3 ms", "..."]),
                         ("print('a b')", []), ("None", [])]
    out = helpers.run_cpython(_write(b, tmp_path), cwd=str(tmp_path))
    with pytest.raises(AssertionError, match="README: total 4.5 in 3 ms"):
        check_transcript(b, out)                            # it printed 4.5, not "total ..."
    check_transcript(b, out.replace("4.5", "total 9.0 in 12 ms"))   # numbers aside, the same line
    b.exact = True
    with pytest.raises(AssertionError, match="differs \\(exactly\\)"):
        check_transcript(b, out.replace("4.5", "total 9.0 in 12 ms"))
    with pytest.raises(AssertionError, match="never ran"):
        check_transcript(b, out.split("--- readme step 2")[0])


def test_a_failing_block_fails(tmp_path):
    b = blocks("<!-- run: cpython -->\n```\n>>> 1 + undefined_name\n```\n")[0]
    with pytest.raises(AssertionError, match="NameError"):
        helpers.run_cpython(_write(b, tmp_path), cwd=str(tmp_path))


def _write(block, folder):
    path = folder / "block.py"
    path.write_text(program(block))
    return path
