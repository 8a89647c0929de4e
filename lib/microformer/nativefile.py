# microformer.nativefile: where the C kernels' module is looked for. backend.py looks before it loads
# kernels_native.py (a board without the file never loads that), and kernels_native.py loads it.

NATIVE_FILE = "mf_native.mpy"          # the C kernels (make native; make deploy NATIVE=1)


def native_file():
    """The path of the first mf_native.mpy on sys.path, or None (one stat per folder)."""
    import os
    import sys
    for d in sys.path:
        p = (d.rstrip("/") + "/" if d else "") + NATIVE_FILE
        try:
            os.stat(p)
            return p
        except OSError:
            pass
    return None
