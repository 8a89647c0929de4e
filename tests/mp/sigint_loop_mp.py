# Busy-waits until the file STOP exists, catching every KeyboardInterrupt (Ctrl-C / SIGINT) and
# printing "caught N" for each; test_mp32_build.py sends it bursts of two SIGINTs:
#   micropython tests/mp/sigint_loop_mp.py STOP
# prints "ready" first and "done N" at the end.
import os
import sys

stop = sys.argv[1]


def stopped():
    try:
        os.stat(stop)
        return True
    except OSError:
        return False


print("ready")
caught = 0
while True:
    try:
        while not stopped():
            pass
        break
    except KeyboardInterrupt:
        caught += 1
        print("caught", caught)
print("done", caught)
