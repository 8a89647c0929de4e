# A smaller start: `import microformer` leaves the checkpoint module, the sequence layers and
# decoding, the optimizers, Dropout, and the viper optimizer and convolution kernels unloaded until first use; every
# name still resolves, to the same object the module defines.
import pytest

import helpers

_SCRIPT = r"""
import sys
import microformer as mf
from microformer import backend
LAZY = ("microformer.checkpoint", "microformer.block", "microformer.norm", "microformer.feedforward",
        "microformer.embedding", "microformer.posenc", "microformer.viper_optim", "microformer.viper_conv",
        "microformer.optim", "microformer.dropout")
print("LOADED", sorted(m for m in LAZY if m in sys.modules))
import microformer.checkpoint as ck
import microformer.block as bl
print("SAME", mf.save_checkpoint is ck.save, mf.load_checkpoint is ck.load, mf.CheckpointError is ck.CheckpointError,
      mf.checkpoint is ck, mf.EncoderBlock is bl.EncoderBlock, mf.prefill is bl.prefill,
      mf.decode_step is bl.decode_step, mf.LayerNorm is sys.modules["microformer.norm"].LayerNorm)
import microformer.optim as op
print("OPTIM", mf.Adam is op.Adam, mf.SGD is op.SGD, mf.clip_grad_norm is op.clip_grad_norm)
import microformer.dropout as dr
print("DROPOUT", mf.Dropout is dr.Dropout, mf.Attention(8, 2, dropout=0.25).dropout, mf.Attention(8, 2).dropout)
try:
    mf.no_such_name
except AttributeError as e:
    print("ATTR", "no_such_name" in str(e))
if "viper" in mf.available_backends():
    mf.set_backend("viper")
    K = backend.K
    print("VIPER", "microformer.viper_optim" in sys.modules, "microformer.viper_conv" in sys.modules)
    import microformer.viper_optim as vo
    import microformer.viper_conv as vc
    print("KERNELS", K.adam_step is vo.adam_step, K.sgd_update is vo.sgd_update,
          K.conv1d_forward is vc.conv1d_forward)
    try:
        K.no_such_kernel
    except AttributeError as e:
        print("KATTR", "no_such_kernel" in str(e))
"""


def test_import_leaves_the_rarer_parts_for_later(tmp_path, micropython):
    p = tmp_path / "lazy.py"
    p.write_text(_SCRIPT)
    out = helpers.run_micropython(p, exe=micropython)
    assert "LOADED []" in out, out
    assert "SAME True True True True True True True True" in out, out
    assert "OPTIM True True True" in out, out
    assert "DROPOUT True 0.25 0.0" in out, out
    assert "ATTR True" in out, out
    assert "VIPER False False" in out, out          # set_backend alone loads neither
    assert "KERNELS True True True" in out, out
    assert "KATTR True" in out, out


def test_lazy_names_on_cpython(tmp_path):
    p = tmp_path / "lazy.py"
    p.write_text(_SCRIPT)
    out = helpers.run_cpython(p)
    assert "SAME True True True True True True True True" in out, out
    assert "OPTIM True True True" in out, out
    assert "DROPOUT True 0.25 0.0" in out, out
    assert "ATTR True" in out, out


@pytest.mark.parametrize("name", ["save_checkpoint", "EncoderBlock", "Adam"])
def test_a_lazy_name_is_bound_once(tmp_path, micropython, name):
    # after the first use the name is an attribute of the package (later uses skip __getattr__)
    p = tmp_path / "once.py"
    p.write_text("import microformer as mf\nv = getattr(mf, %r)\nprint('BOUND', mf.__dict__.get(%r) is v)\n" % (name, name))
    out = helpers.run_micropython(p, exe=micropython)
    assert "BOUND True" in out, out
