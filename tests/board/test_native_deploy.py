"""make deploy NATIVE=1 on the virtual board: the C kernels built for the board's architecture go to
/lib/mf_native.mpy, the board then trains on them by default and says so (deploy's last line, the
session's first line), and its golden vectors pass on them."""
import os

import pytest

import helpers
import board_link  # noqa: E402
import deploy  # noqa: E402
import vboard  # noqa: E402

MICROPYTHON = helpers.interpreter_path(helpers.interpreters()[-1])
ARCH = "x64" if helpers.traits(MICROPYTHON)["bits"] == 64 else "x86"


@pytest.fixture(scope="module")
def board(tmp_path_factory, iris_checkpoint):
    mpy = os.path.join(helpers.ROOT, "build", "native", ARCH, "mf_native.mpy")
    src = os.path.join(helpers.ROOT, "host", "native", "mf_native.c")
    if not os.path.exists(mpy) or os.path.getmtime(mpy) < os.path.getmtime(src):
        r = helpers.make("native", "NATIVE_ARCHS=" + ARCH, timeout=900)
        if r.returncode:
            text = r.stdout + r.stderr
            if "needs MicroPython's source and extras" in text and not helpers.on_ci():
                pytest.skip("the native module cannot be built here: " + text.strip().splitlines()[-1])
            pytest.fail("make native failed:\n" + text[-3000:])
    b = vboard.VirtualBoard(tmp_path_factory.mktemp("vboard"), heap=helpers.board_heap(MICROPYTHON), micropython=MICROPYTHON)
    b.start()
    try:
        out = deploy.deploy(str(b.port), str(iris_checkpoint), native=True)
        yield b, out
    finally:
        b.stop()


def test_deploy_installs_the_module_and_the_board_uses_it(board):
    b, out = board
    assert "default: native - the default on MicroPython: /lib/mf_native.mpy (%s)" % ARCH in out, out
    session = board_link.mpremote(str(b.port), "exec", "import finetune\ns = finetune.Session()\ns.fit(epochs=1)",
                                  timeout=300)
    first = [ln for ln in session.splitlines() if "examples; backend" in ln]
    assert first and first[0].endswith("backend native (the default on MicroPython: /lib/mf_native.mpy (%s))" % ARCH), session
    assert "epoch 1/1" in session, session


def test_selftest_passes_on_the_native_kernels(board):
    b, _ = board
    out = board_link.mpremote(str(b.port), "exec", "import selftest\nselftest.run()", timeout=600)
    lines = [ln for ln in out.splitlines() if ln.startswith("native ")]
    assert len(lines) >= 20 and all(ln.endswith("PASS") for ln in lines), out
    assert "0 failed" in out, out
