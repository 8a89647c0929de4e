"""The board path end to end: real mpremote against the virtual board (real MicroPython behind a pty).

deploy -> selftest -> fit -> save -> soft reset -> reload bit-identical; user examples survive a
reset; damaged checkpoints are refused on the board; a too-small heap names the memory need;
mip installs from lib/package.json; make demo's story holds.
"""
import re
import subprocess
import sys

import pytest

import helpers
import microformer as mf
import board_link  # noqa: E402
import deploy  # noqa: E402
import vboard  # noqa: E402

# The interpreter the virtual board runs: the ESP32-like 32-bit port when it is built.
MICROPYTHON = helpers.interpreter_path(helpers.interpreters()[-1])

WEIGHTS = ("import binascii\n"
           "for n, p in s.model.named_params():\n"
           " print('W', n, binascii.hexlify(bytes(p.data)).decode())\n")


def _weights(out):
    return dict(line.split()[1:] for line in out.splitlines() if line.startswith("W "))


@pytest.fixture(scope="module")
def board(tmp_path_factory, iris_checkpoint):
    b = vboard.VirtualBoard(tmp_path_factory.mktemp("vboard"), heap="512K", micropython=MICROPYTHON)
    b.start()
    try:
        deploy.deploy(str(b.port), str(iris_checkpoint))
        yield b
    finally:
        b.stop()


def run(board, code, resume=False, timeout=300):
    args = (["resume"] if resume else []) + ["exec", code]
    return board_link.mpremote(str(board.port), *args, timeout=timeout)


def test_deploy_is_incremental_and_cleans_stale_modules(board, iris_checkpoint):
    flash = board.flash
    (flash / "lib" / "microformer" / "stale.py").write_text("raise ImportError('stale')\n")
    out = deploy.deploy(str(board.port), str(iris_checkpoint))
    assert "removed stale stale.py" in out
    assert "microformer 0.1.0 backends: ['python', 'viper']" in out
    mpy = sorted(p.name for p in (flash / "lib" / "microformer").iterdir())
    assert "attention.mpy" in mpy and not any(n.endswith(".py") for n in mpy)


def test_selftest_passes_on_the_board(board):
    out = run(board, "import selftest\nprint('SELFTEST', selftest.run())")
    assert "SELFTEST True" in out, out
    assert re.search(r"selftest: \d+ passed, 0 failed", out)
    assert "viper   weights" in out and "FAIL" not in out
    assert re.search(r"viper   decoder \S+ +max err", out) and re.search(r"viper   conv1d \S+ +max err", out), out


def test_fit_save_soft_reset_reload_is_bit_identical(board):
    out = run(board, "import finetune\ns = finetune.Session(verbose=False)\ns.clear_examples()\n" + WEIGHTS)
    loaded = _weights(out)
    out = run(board, "import finetune\ns = finetune.Session(verbose=False)\n"
                     "s.fit(epochs=2, data='train')\ns.save()\n" + WEIGHTS)
    saved = _weights(out)
    assert len(saved) == 12   # Dense W b, Attention Wq bq Wk bk Wv bv Wo bo, Dense W b
    assert saved != loaded, "fit changed nothing"
    # a new mpremote call soft-resets the board: nothing survives but the flash
    out = run(board, "import finetune\ns = finetune.Session(verbose=False)\n" + WEIGHTS)
    assert _weights(out) == saved


def test_user_examples_survive_a_soft_reset(board):
    run(board, "import finetune\ns = finetune.Session(verbose=False)\ns.clear_examples()\n"
               "s.add_example([6.1, 2.8, 4.7, 1.2], 'versicolor')\n")
    out = run(board, "import finetune\ns = finetune.Session(verbose=False)\n"
                     "print('USER', len(s._user_y))\nprint(open('data/user.csv').read())")
    assert "USER 1" in out
    assert "6.1,2.8,4.7,1.2,versicolor" in out
    run(board, "import finetune\nfinetune.Session(verbose=False).clear_examples()")


@pytest.mark.parametrize("damage,message", [
    ("d = d[:len(d) // 2]", "truncated"),
    ("d = bytearray(d); d[len(d) // 2] ^= 0x10", "bad CRC"),
    ("d = b'JUNK' + d[4:]", "not a microformer checkpoint"),
])
def test_damaged_checkpoint_is_refused_on_the_board(board, damage, message):
    out = run(board,
              "good = open('model.mfck', 'rb').read()\nd = good\n" + damage + "\n"
              "open('model.mfck', 'wb').write(d)\n"
              "import finetune\n"
              "try:\n finetune.Session(verbose=False)\n print('LOADED')\n"
              "except ValueError as e:\n print('REFUSED', e)\n"
              "open('model.mfck', 'wb').write(good)\n")
    assert "LOADED" not in out
    assert "REFUSED" in out and message in out, out


def test_too_small_heap_names_the_memory_need(tmp_path, iris_checkpoint):
    # a heap the package imports into but a batch of 120 does not fit (the import grows with the
    # layers: ~7 KB more with dropout and the tiled attention, on the 32-bit port)
    with vboard.VirtualBoard(tmp_path / "small", heap="224K", micropython=MICROPYTHON) as b:
        deploy.deploy(str(b.port), str(iris_checkpoint))
        out = board_link.mpremote(str(b.port), "exec",
                                  "import finetune\n"
                                  "try:\n s = finetune.Session(batch_size=120, verbose=False)\n"
                                  " s.fit(epochs=1, data='train')\n print('FITTED')\n"
                                  "except MemoryError as e:\n print('MEMORY', e)\n", timeout=300)
    assert "MEMORY" in out, out
    assert re.search(r"needs about \d+ bytes", out), out


def test_mip_installs_from_package_json(tmp_path):
    subprocess.run([sys.executable, "host/package.py", "--check"], cwd=helpers.ROOT, check=True)
    with vboard.VirtualBoard(tmp_path / "mip", heap="512K", micropython=MICROPYTHON) as b:
        board_link.mpremote(str(b.port), "mip", "install", str(helpers.ROOT) + "/lib/package.json")
        out = board_link.mpremote(str(b.port), "exec", "import microformer\nprint('VERSION', microformer.__version__)")
        assert "VERSION %s" % mf.__version__ in out      # the board runs this tree's package
        assert (b.flash / "lib" / "microformer" / "attention.py").exists()


def test_demo_story(board, iris_checkpoint, capsys):
    import demo
    demo.main(["--port", str(board.port), "--checkpoint", str(iris_checkpoint)])
    out = capsys.readouterr().out
    acc = [float(v) for v in re.findall(r"accuracy ([\d.]+)% \(\d+/30\) on list", out)]
    assert len(acc) == 3, out
    before, after, reloaded = acc
    assert after >= before + 20, out
    assert reloaded == after
