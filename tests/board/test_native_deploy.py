"""make deploy NATIVE=1 on the virtual board: the C kernels built for the board's architecture go to
/lib/mf_native.mpy, the board then trains on them by default and says so (deploy's last line, the
session's first line), and its golden vectors pass on them."""
import pytest

import helpers
import board_link  # noqa: E402
import deploy  # noqa: E402
import vboard  # noqa: E402

MICROPYTHON = helpers.interpreter_path(helpers.interpreters()[-1])
ARCH = "x64" if helpers.traits(MICROPYTHON)["bits"] == 64 else "x86"


@pytest.fixture(scope="module")
def board(tmp_path_factory, iris_checkpoint, deployed_flash):
    helpers.native_module(ARCH)
    folder = tmp_path_factory.mktemp("vboard")
    deployed_flash(folder, MICROPYTHON)     # deployed before without NATIVE=1: the module is what changes
    b = vboard.VirtualBoard(folder, heap=helpers.board_heap(MICROPYTHON), micropython=MICROPYTHON)
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
