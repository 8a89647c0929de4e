# microformer.lazy: the one way the package imports a module on first use, so that what a program
# never needs stays off the heap (a board without PSRAM has a small one). The board session's
# first-use imports stay `import` statements inside functions: host/tools/package.py follows those to
# list the session's files.
#   module(full, what)       the module `full` (dotted), imported now if it is not yet
#   sibling(name, what)      the module `name` of this package (microformer, or the package a copy
#                            of this file sits in, as in the tests' instrumented viper kernels)
#   bind(g, name, mod, attr) g[name] = mod.attr, for a module's __getattr__: bound once, so later
#                            uses of the name never come back to __getattr__
#   release(name)            forget the module `name` of this package, so that its heap goes back
#                            once nothing else holds it; its next use imports it again (the kernel
#                            table, read when a backend is chosen)
#   stub(load, name)         a method whose first call runs load() (it imports a module and makes
#                            that module's functions the class's methods, in place of its stubs)
#                            and then the function `name` of what load() returned
#   adopt(cls, holder, names) the functions `names` of `holder` (a module or class) become cls's
#                            methods, in place of its stubs; returns holder (what a stub's load() gives)
# An import that fails inside the module raises ImportError naming the module, what wanted it and
# the module's own message (MicroPython keeps no chained cause). Modules are imported by their
# full name: `from . import name` inside a package whose __getattr__ loads lazily would come back
# to that __getattr__.
import sys

_PKG = __name__.rpartition(".")[0]


def module(full, what=None):
    m = sys.modules.get(full)
    if m is None:
        try:
            __import__(full)
        except ImportError as e:
            if what is None:
                raise
            raise ImportError("%s (for %s) failed to import: %s" % (full, what, e))
        m = sys.modules[full]
    return m


def sibling(name, what=None):
    return module(_PKG + "." + name if _PKG else name, what)


def bind(g, name, mod, attr=None):
    v = g[name] = getattr(mod, attr or name)
    return v


def release(name):
    full = _PKG + "." + name if _PKG else name
    sys.modules.pop(full, None)
    pkg = sys.modules.get(_PKG) if _PKG else None
    if pkg is not None:
        try:
            delattr(pkg, name)
        except (AttributeError, KeyError):         # MicroPython: KeyError when it is not there
            pass


def stub(load, name):
    def f(self, *args, **kw):
        return getattr(load(), name)(self, *args, **kw)
    return f


def adopt(cls, holder, names):
    for name in names:
        setattr(cls, name, getattr(holder, name))
    return holder
