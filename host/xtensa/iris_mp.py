# board/iris.py trained on viper for argv[1] epochs (default 30), printed as JSON (as
# tests/mp/iris_run_mp.py does on the unix ports)
import json
import sys

import iris

epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 30
r = iris.main(epochs=epochs, backend="viper", verbose=False)
del r["confusion"]
print(json.dumps(r))
