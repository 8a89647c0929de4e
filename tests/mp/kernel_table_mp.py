# The kernel table checked inside MicroPython (and CPython): every backend this interpreter runs
# holds every kernel of microformer.kernel_table, each viper module loaded on first use included,
# and a kernel resolves to the same function on a second use. Prints one TABLE line per backend,
# and KEPT: whether the table is still loaded after `import microformer` (MicroPython lets it go).
#   MICROPYPATH=lib micropython tests/mp/kernel_table_mp.py
import sys

import microformer as mf
from microformer import backend

print("KEPT", "microformer.kernel_table" in sys.modules, "kernel_table" in dir(mf) if sys.implementation.name != "micropython"
      else "kernel_table" in mf.__dict__)
from microformer import kernel_table  # noqa: E402

for which in mf.available_backends():
    mf.set_backend(which)
    K = backend.K
    names = list(kernel_table.kernels())
    kernel_table.check(K, which)            # loads every lazily loaded module, each checked as it loads
    same = all(getattr(K, n) is getattr(K, n) for n in names)
    print("TABLE", which, len(names), same)
