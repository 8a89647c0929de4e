# microformer.kernels_native: the 'native' backend: the hot kernels of kernels.py in C, from the
# dynamic native module mf_native.mpy (host/native/: `make native` builds it for x64, x86 and
# xtensawin; `make deploy NATIVE=1` installs the board's). Same names, same arguments (outputs
# first, inputs, sizes last); float32 arithmetic, each error bound written next to its code in
# host/native/mf_native.c and listed in lib/README.md's tolerances.
#
# Before importing, the module file's header is checked against this interpreter: an .mpy built
# for another architecture or another .mpy version is refused with both named (ImportError), and
# the backend switch then says so in backend.why.
#
# NATIVE lists the kernels in C; PORTABLE the kernels of kernels.py this backend takes from the
# portable loops (bound on first use, so a model that needs none of them never loads kernels.py):
# every kernel of kernels.py is in exactly one of the two (tests/mp/test_native.py checks it).
import sys

from .nativefile import native_file

_MODULE = "mf_native"

NATIVE = (
    "zero", "copy", "first_nonfinite", "add_forward",                        # guards, residuals
    "argmax", "gather_rows",                                                  # a class or token, a batch
    "matmul_forward", "matmul_forward_kept", "matmul_backward",               # the GEMM
    "matmul_backward_input", "matmul_backward_input_acc", "matmul_backward_weight",
    "attention_forward", "attention_backward", "attention_decode",            # scores, softmax, A.V
    "conv1d_forward", "conv1d_backward",                                      # Conv1D (kernels.py's walk)
    "embedding_forward", "embedding_backward", "posenc_forward", "posembed_backward",  # sequences
    "kv_store", "dropout_apply",
    "act_forward", "act_backward",                                            # every activation kind
    "avgpool_forward", "avgpool_backward", "crossentropy_softmax",
    "layernorm_forward", "layernorm_backward",
    "adam_update", "sgd_update", "adam_step", "sgd_step", "params_commit",    # optimizers
)

PORTABLE = (
    "mse", "sum_squares", "scale_inplace", "max_exponent",           # loss and optimizer odds and ends
    "max_exponent_pairs",
    "q8_matmul_forward", "q8_matmul_backward_input",                 # int8 frozen weights
    "maxpool1d_forward", "maxpool1d_backward", "avgpool1d_forward", "avgpool1d_backward",
    "posenc_table",                                                  # built once per layer (sin, cos)
    "kv_shift", "attention_scores",                                  # the stream's window, the golden stages
    "attention_forward_tiled", "attention_backward_tiled",           # key-tiled attention (memory)
    "dropout_mask", "attention_context", "attention_backward_dropout",
)

_ARCHS = ("none", "x86", "x64", "armv6", "armv6m", "armv7m", "armv7em", "armv7emsp", "armv7emdp",
          "xtensa", "xtensawin", "rv32imc", "rv64imc")


def _arch_name(i):
    return _ARCHS[i] if 0 <= i < len(_ARCHS) else "arch %d" % i


def check_header(path, mpy):
    """None when the .mpy at path loads in an interpreter whose sys.implementation._mpy is mpy,
    else a sentence naming what the file was built for and what this interpreter runs."""
    with open(path, "rb") as f:
        head = f.read(4)
    if len(head) < 4 or head[0] != 0x4D:          # 'M'
        return "%s is not an .mpy file" % path
    want_v, want_sub, want_arch = mpy & 0xFF, (mpy >> 8) & 3, (mpy >> 10) & 0xF
    v, sub, arch = head[1], head[2] & 3, head[2] >> 2
    if arch != want_arch:
        return ("%s is built for %s, this MicroPython runs %s native code (make native; make deploy "
                "NATIVE=1 installs the board's)" % (path, _arch_name(arch), _arch_name(want_arch)))
    if (v, sub) != (want_v, want_sub):
        return "%s is .mpy %d.%d, this MicroPython loads .mpy %d.%d" % (path, v, sub, want_v, want_sub)
    return None


def _load():
    impl = sys.implementation
    if impl.name != "micropython":
        raise ImportError("the native kernels are a MicroPython module (%s runs %s)" % (_MODULE, impl.name))
    mpy = getattr(impl, "_mpy", 0)
    if not (mpy >> 10) & 0xF:
        raise ImportError("this MicroPython loads no native code (sys.implementation._mpy has no architecture)")
    path = native_file()
    if path is None:
        raise ImportError("no %s.mpy on sys.path (make native builds it; make deploy NATIVE=1 installs "
                          "it on a board)" % _MODULE)
    why = check_header(path, mpy)
    if why:
        raise ImportError(why)
    mod = __import__(_MODULE)
    if getattr(mod, "ABI", None) != 1:
        raise ImportError("%s is not microformer's native module (ABI %r, expected 1)"
                          % (path, getattr(mod, "ABI", None)))
    return mod, path


_N, PATH = _load()
ARCH = _arch_name((sys.implementation._mpy >> 10) & 0xF)


def _err(kernel, arg, need, got):
    # called by mf_native with a kernel's and an argument's names when the argument is wrong: got
    # -1 for a buffer of the wrong kind, need -2 for a negative size, else the sizes' need and got
    if need == -2:
        raise ValueError("%s: size %s must be >= 0, got %d" % (kernel, arg, got))
    if arg == "arguments":
        raise TypeError("%s takes %d arguments, got %d" % (kernel, need, got))
    if got == -1 and arg not in ("labels", "kind", "t", "T", "NH", "ids", "pos", "idx"):
        raise ValueError("%s: %s must be a float32 buffer (array('f')) of at least %d values"
                         % (kernel, arg, need) if arg not in ("mask", "keep") else
                         "%s: %s must be bytes-like (%d bytes) or None" % (kernel, arg, need))
    if arg == "idx":
        raise ValueError("%s: idx must hold row numbers in [0, %d), got %d" % (kernel, need, got))
    if arg == "ids":
        raise ValueError("%s: ids must be ints in [0, %d), got %d" % (kernel, need, got))
    if arg == "pos":
        raise ValueError("%s: pos + S must be <= L: pos must be <= %d, got %d" % (kernel, need, got))
    if arg == "labels":
        raise ValueError("%s: labels must be ints in [0, %d), got %d" % (kernel, need, got))
    if arg == "kind":
        raise ValueError("%s: unknown activation kind %r" % (kernel, got))
    if arg == "t":
        raise ValueError("%s: the step count t must be >= 1, got %d" % (kernel, got))
    if arg == "groups":
        raise ValueError("%s: stride, dilation and groups must be >= 1 and groups must divide C=%d and OC, "
                         "got groups=%d" % (kernel, need, got))
    if arg == "T":
        raise ValueError("%s: T (cached keys) must be in 1..L=%d, got %d" % (kernel, need, got))
    if arg == "NH":
        raise ValueError("%s: C=%d must be a multiple of NH, got NH=%d" % (kernel, need, got))
    if arg in ("news", "olds"):
        raise ValueError("%s: %s must hold %d state buffers, got %d" % (kernel, arg, need, got))
    if arg == "params":
        raise ValueError("%s: params[%d] must be a (param, grad) pair of float32 Tensors with equal sizes"
                         % (kernel, need))
    if arg == "B":
        raise ValueError("%s: B and V must be >= 1, got %d" % (kernel, got))
    raise ValueError("%s: %s holds %d values, the sizes need %d" % (kernel, arg, got, need))


_N._err = _err

for _name in NATIVE:
    globals()[_name] = getattr(_N, _name)
del _name


def __getattr__(name):
    # a kernel of PORTABLE: the portable loop, bound here once
    if name not in PORTABLE:
        raise AttributeError("module '%s' has no attribute '%s'" % (__name__, name))
    from . import kernels
    f = globals()[name] = getattr(kernels, name)
    return f
