# Runs board/demos/iris.py's main() and prints its result as JSON (MicroPython or CPython).
#   MICROPYPATH=lib:board:board/demos:board/benchmarks:tests/mp micropython tests/mp/iris_run_mp.py [python|viper] [epochs]
import json
import sys

if __name__ == "__main__":
    import iris
    backend = sys.argv[1] if len(sys.argv) > 1 else None
    epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    r = iris.main(epochs=epochs, backend=backend, verbose=False)
    del r["confusion"]
    print(json.dumps(r))
