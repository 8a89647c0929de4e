# microformer.backend: which kernels the layers call.
# 'python' (kernels.py) runs anywhere; 'viper' (kernels_viper.py) needs MicroPython's native emitter.
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


def set_backend(which):
    """Select the kernels every layer uses: 'python' or 'viper'."""
    global K, name
    if which == "python":
        K = _python_kernels
    elif which == "viper":
        K = _viper_kernels()
    else:
        raise ValueError("set_backend: expected 'python' or 'viper', got %r" % (which,))
    name = which


def _default():
    # MicroPython with the native emitter trains on the viper kernels; anything else on the portable ones
    import sys
    if sys.implementation.name != "micropython":
        return
    try:
        set_backend("viper")
    except ValueError:
        pass


def get_backend():
    return name


def available():
    """The backends this interpreter can run."""
    out = ["python"]
    try:
        _viper_kernels()
        out.append("viper")
    except ValueError:
        pass
    return out


_default()
