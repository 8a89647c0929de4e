# microformer.backend: which kernels the layers call.
# 'python' (kernels.py) runs anywhere; 'viper' (kernels_viper.py) needs MicroPython's native emitter;
# 'numpy' (kernels_numpy.py) needs CPython with NumPy (the host); 'native' (kernels_native.py) needs
# MicroPython and the C module mf_native.mpy built for its architecture on sys.path (make native,
# make deploy NATIVE=1): the default whenever it loads, viper otherwise (backend.why says which).
# Every backend is checked against the kernel table (kernel_table.py) when it is selected: a
# kernel the table names that the backend lacks, or (where the interpreter tells, CPython) one
# that takes another number of arguments, is a ValueError naming the kernel and the backend.
# The viper and native modules check themselves as they load (viper's rarer modules load, and are
# checked, on first use); kernels_viper holds every kernel of kernels.py: its own, and the ones
# the table leaves portable on viper by design; nothing is filled in behind its back.


import sys

from .lazy import release, sibling
from .nativefile import NATIVE_FILE, native_file

K = None                # the kernel module the layers call (set below, at import)
name = None             # its name: 'python', 'viper' or 'numpy'
why = None              # why this one: set_backend's caller, or what the interpreter offered


def _table_error(e):
    # a backend that does not match the kernel table is an error to report, never a reason to
    # fall back to another backend: raised again here (only a loaded table raises one)
    table = sys.modules.get(__name__.rpartition(".")[0] + ".kernel_table")
    if table is not None and isinstance(e, table.KernelTableError):
        raise e


def _let_table_go():
    # on MicroPython the table is read when a backend is chosen, then let go (3 KB of text)
    if sys.implementation.name == "micropython":
        release("kernel_table")


def _viper_kernels():
    try:
        from . import kernels_viper
    except (ImportError, SyntaxError, NotImplementedError, ValueError) as e:
        _table_error(e)
        raise ValueError("set_backend: 'viper' needs MicroPython with the native emitter (%s)" % (e,))
    return kernels_viper


def _native_kernels():
    try:
        from . import kernels_native
    except (ImportError, ValueError, OSError) as e:
        _table_error(e)
        raise ValueError("set_backend: 'native' needs MicroPython and mf_native.mpy for its architecture: %s" % (e,))
    return kernels_native


def _numpy_kernels():
    try:
        from . import kernels_numpy
    except (ImportError, AttributeError) as e:      # MicroPython: no NumPy, or no such module on the board
        raise ValueError("set_backend: 'numpy' needs CPython with NumPy (%s)" % (e,))
    return kernels_numpy


def set_backend(which, reason=None):
    """Select the kernels every layer uses: 'python', 'viper' or 'numpy'. ValueError when this
    interpreter cannot run them (nothing changes then). 'native': the C kernels of mf_native.mpy. `reason`: what backend.why says (by
    default that the caller chose it)."""
    global K, name, why
    if which == "python":
        k = sibling("kernels")              # loaded on first use: a board on viper never needs it
        sibling("kernel_table").check(k, which)
    elif which == "viper":
        k = _viper_kernels()
    elif which == "numpy":
        k = _numpy_kernels()
        sibling("kernel_table").check(k, which)
    elif which == "native":
        k = _native_kernels()
    else:
        raise ValueError("set_backend: expected 'python', 'viper', 'numpy' or 'native', got %r" % (which,))
    K = k
    name = which
    why = reason or "chosen with set_backend(%r)" % which
    _let_table_go()


def use_default():
    """Select the interpreter's default backend (what `import microformer` chose), whatever an
    earlier set_backend left; `why` says why it is the one."""
    # MicroPython trains on the C kernels when mf_native.mpy for its architecture is on sys.path,
    # else on the viper kernels (with the native emitter); CPython with NumPy on the NumPy kernels;
    # without them on the portable ones, and `why` says what was missing
    import sys
    fast = "viper" if sys.implementation.name == "micropython" else "numpy"
    where = "MicroPython" if fast == "viper" else "CPython"
    missing = ""
    if fast == "viper" and native_file() is None:
        missing = "no %s on sys.path (make native builds it; make deploy NATIVE=1 installs it on a board)" % NATIVE_FILE
    elif fast == "viper":
        try:
            k = _native_kernels()
            set_backend("native", "the default on MicroPython: %s (%s)" % (k.PATH, k.ARCH))
            return
        except ValueError as e:
            _table_error(e)
            missing = str(e).split(": ", 2)[-1]
    try:
        set_backend(fast, "the default on %s" % where + ("; not native: " + missing if fast == "viper" else ""))
    except ValueError as e:
        _table_error(e)
        set_backend("python", "the default on %s without the %s backend: %s" % (where, fast, e))


def get_backend():
    """The name of the backend in use; `backend.why` says why it is the one."""
    return name


def available():
    """The backends this interpreter can run."""
    out = ["python"]
    for which, load in (("viper", _viper_kernels), ("numpy", _numpy_kernels), ("native", _native_kernels)):
        try:
            load()
            out.append(which)
        except ValueError as e:
            _table_error(e)
    _let_table_go()
    return out


use_default()
