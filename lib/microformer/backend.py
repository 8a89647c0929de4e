# microformer.backend: which kernels the layers call.
# 'python' (kernels.py) runs anywhere; 'viper' (kernels_viper.py) needs MicroPython's native emitter;
# 'numpy' (kernels_numpy.py) needs CPython with NumPy (the host).
# kernels_viper holds every kernel of kernels.py: its own, and the ones it lists in PORTABLE
# (portable by design); nothing is filled in behind its back.
from . import kernels as _python_kernels


K = _python_kernels
name = "python"


def _viper_kernels():
    try:
        from . import kernels_viper
    except (ImportError, SyntaxError, NotImplementedError, ValueError) as e:
        raise ValueError("set_backend: 'viper' needs MicroPython with the native emitter (%s)" % (e,))
    return kernels_viper


def _numpy_kernels():
    try:
        from . import kernels_numpy
    except (ImportError, AttributeError) as e:      # MicroPython: no NumPy, or no such module on the board
        raise ValueError("set_backend: 'numpy' needs CPython with NumPy (%s)" % (e,))
    return kernels_numpy


def set_backend(which):
    """Select the kernels every layer uses: 'python', 'viper' or 'numpy'."""
    global K, name
    if which == "python":
        K = _python_kernels
    elif which == "viper":
        K = _viper_kernels()
    elif which == "numpy":
        K = _numpy_kernels()
    else:
        raise ValueError("set_backend: expected 'python', 'viper' or 'numpy', got %r" % (which,))
    name = which


def _default():
    # MicroPython with the native emitter trains on the viper kernels, CPython with NumPy on the
    # NumPy kernels; anything else on the portable ones (get_backend() says which)
    import sys
    try:
        set_backend("viper" if sys.implementation.name == "micropython" else "numpy")
    except ValueError:
        pass


def get_backend():
    return name


def available():
    """The backends this interpreter can run."""
    out = ["python"]
    for which, load in (("viper", _viper_kernels), ("numpy", _numpy_kernels)):
        try:
            load()
            out.append(which)
        except ValueError:
            pass
    return out


_default()
