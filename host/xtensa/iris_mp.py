# board/demos/iris.py trained for argv[1] epochs from each seed of argv[2] (separated by colons: QEMU's
# command line takes no commas) on the backend argv[3] (default viper), one JSON line per seed;
# host/xtensa/xtest.py runs it on the emulated core and on the 32-bit port
import json
import sys

import iris

epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 40
seeds = [int(s) for s in (sys.argv[2] if len(sys.argv) > 2 else "1:2:3").split(":")]
backend = sys.argv[3] if len(sys.argv) > 3 else "viper"
for seed in seeds:
    r = iris.main(epochs=epochs, backend=backend, seed=seed, verbose=False)
    del r["confusion"]
    r["seed"] = seed
    print(json.dumps(r))
