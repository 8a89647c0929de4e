# microformer.backend: which kernels the layers call.
# 'python' (kernels.py) runs anywhere; 'viper' (kernels_viper.py) needs MicroPython's native emitter;
# 'numpy' (kernels_numpy.py) needs CPython with NumPy (the host).
# A kernel the viper module does not define falls back to the portable one.
from . import kernels as _python_kernels


class _Kernels:
    """A namespace: every name of kernels.py, taken from `fast` where it defines it."""

    def __init__(self, fast, portable):
        for n in dir(portable):
            if not n.startswith("__"):
                setattr(self, n, getattr(fast, n, getattr(portable, n)))


K = _python_kernels
name = "python"


def _viper_kernels():
    try:
        from . import kernels_viper
    except (ImportError, SyntaxError, NotImplementedError, ValueError) as e:
        raise ValueError("set_backend: 'viper' needs MicroPython with the native emitter (%s)" % (e,))
    return _Kernels(kernels_viper, _python_kernels)


def _numpy_kernels():
    try:
        from . import kernels_numpy
    except ImportError as e:
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
