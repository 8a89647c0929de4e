# microformer.kernel_table: every kernel the layers call through backend.K, in one place: its
# name, where the viper and the native backends take it from, and its arguments (outputs first,
# inputs, sizes last). The portable kernels (kernels.py) and the NumPy kernels (kernels_numpy.py)
# define every one under these names with these arguments.
#   viper:  the generated module viper_<viper>.py that defines it (host/viper/<viper>.py, make
#           viper), or '-': the portable kernel on viper by design (kernels_viper.PORTABLE says why)
#   native: 'C' in mf_native.mpy (host/native/mf_native.c, make native), or '-': the portable kernel
# backend.set_backend checks the module it selects against this table at once (check below); the
# viper modules a program loads on first use are checked when they load; tests/unit/
# test_kernel_table.py compares the table with every backend's source, arguments included.
# Arguments named `pool` and `heads` are descriptors: a tuple of the sizes of a kernel that would
# otherwise take 9 to 17 positional arguments, made by the layer once per call (only kernels whose
# argument list no viper or C version fixes take one; lib/README.md says why):
#   pool  = (B, L, C, Lout, KS, stride, pad)   1-D pooling: inp (B, L, C) -> out (B, Lout, C),
#           windows of KS positions every `stride`, `pad` positions of padding on each side
#   heads = (B, Tq, Tk, C, NH, causal, T)      key-tiled attention: q (B, Tq, C), k v (B, Tk, C),
#           NH heads, causal 1 or 0, T keys per tile (the forward's; the backward ignores it)
# One string, not a structure, read when a backend is chosen: on MicroPython the backend then lets
# this module go (lazy.release), so its text costs the heap nothing while a program runs.
TABLE = """\
zero common C buf n
matmul_forward gemm C out inp weight bias N C OC
matmul_forward_kept gemm C out inp weight bias N C OC keep
matmul_backward gemm C dinp dweight dbias dout inp weight N C OC
matmul_backward_input gemm C dinp dout weight N C OC
matmul_backward_weight gemm C dweight dbias dout inp N C OC
matmul_backward_input_acc gemm C dinp dout weight N C OC
q8_matmul_forward q8 - out inp q scale bias N C OC
q8_matmul_backward_input q8 - dinp dout q scale N C OC acc
attention_forward softmax C out att q k v mask B Tq Tk C NH causal
attention_backward softmax C dq dk dv scratch dout att q k v B Tq Tk C NH
attention_context softmax - out att keep v B Tq Tk C NH scale
attention_backward_dropout softmax - dq dk dv scratch dout att keep q k v B Tq Tk C NH pscale
attention_decode softmax C out att q kc vc B T L C NH
attention_scores - - out q k mask B Tq Tk C NH scale causal hidden
attention_forward_tiled - - out stats tile q k v mask heads
attention_backward_tiled - - dq dk dv tile dout out stats q k v mask heads
crossentropy_softmax softmax C dlogits logits labels B V
act_forward elementwise C out inp N kind
act_backward elementwise C dinp dout inp out N kind
dropout_mask elementwise - keep state n threshold
dropout_apply elementwise C out inp keep n scale
first_nonfinite elementwise C buf n
copy elementwise C dst src n
avgpool_forward gemm C out inp B T C
avgpool_backward gemm C dinp dout B T C
mse - - dpred pred target N
sum_squares - - g n
scale_inplace elementwise - g n factor
sgd_update optim C p g buf n lr momentum weight_decay
adam_update optim C p g m v n lr beta1 beta2 eps weight_decay bc1 bc2 decoupled
adam_step optim C newp news params olds hyper
sgd_step optim C newp news params olds hyper
params_commit optim C params newp count seen
max_exponent optim C buf n
max_exponent_pairs optim C params j
add_forward sequence C out a b n
layernorm_forward norm C out inp ln N C eps
layernorm_backward norm C dinp dout inp ln N C
embedding_forward sequence C out ids table N C V
embedding_backward sequence C dtable dout ids N C
posenc_table - - pe L C
posenc_forward sequence C out inp pe B S C start
posembed_backward sequence C dtable dout B S C start
kv_store sequence C cache src B S L C pos
kv_shift - - cache B L C n
argmax rows C buf off n
gather_rows rows C dst src idx start B F
conv1d_forward conv C out inp weight bias B L C Lout OC KS stride pad dil groups
conv1d_backward conv C dinp dweight dbias dout inp weight B L C Lout OC KS stride pad dil groups
maxpool1d_forward - - out idx inp pool
maxpool1d_backward - - dinp dout idx pool
avgpool1d_forward - - out inp pool
avgpool1d_backward - - dinp dout pool
"""


class KernelTableError(ValueError):
    """A backend that does not match the table: a programming error, never a reason to fall back
    to another backend (backend.set_backend lets it through)."""


def rows():
    """[(name, viper, native, (arguments...))] in the table's order (for tools and tests: on a
    board use kernels() or check(), which keep no list)."""
    out = []
    for line in TABLE.split("\n"):
        if line:
            f = line.split()
            out.append((f[0], f[1], f[2], tuple(f[3:])))
    return out


def kernels(column=None, value=None):
    """The kernels' names, in order; with column 'viper' or 'native', those whose entry there is
    `value` ('-': the portable kernel on that backend)."""
    if column not in (None, "viper", "native"):
        raise ValueError("kernel_table.kernels: column must be 'viper', 'native' or None, got %r" % (column,))
    i = (None, "viper", "native").index(column)
    for line in TABLE.split("\n"):
        if line:
            f = line.split(" ", 3)
            if i == 0 or f[i] == value:
                yield f[0]


def check(mod, backend, names=None):
    """Raise KernelTableError (a ValueError) naming the kernel, the backend and expected vs
    received when module `mod` (the kernels of `backend`) lacks a kernel of the table (of `names`
    when given), or, where the interpreter says how many arguments a function takes (CPython),
    takes another number."""
    names = set(names) if names is not None else None
    for line in TABLE.split("\n"):
        if not line:
            continue
        f = line.split()
        if names is not None and f[0] not in names:
            continue
        fn = getattr(mod, f[0], None)
        if fn is None:
            raise KernelTableError("kernel table: the %s backend (%s) lacks the kernel %s(%s)"
                             % (backend, mod.__name__, f[0], ", ".join(f[3:])))
        code = getattr(fn, "__code__", None)
        got = getattr(code, "co_argcount", None)
        if got is not None and got != len(f) - 3:
            raise KernelTableError("kernel table: %s of the %s backend takes %d arguments, expected %d (%s)"
                             % (f[0], backend, got, len(f) - 3, ", ".join(f[3:])))
