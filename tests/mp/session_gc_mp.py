# The GC threshold Session() loads under: every LOAD_GC_SHARE-th of the heap, at most every
# LOAD_GC_BYTES, then the one from before. Runs inside MicroPython (gc.threshold):
#   MICROPYPATH=lib:board micropython -X heapsize=256K tests/mp/session_gc_mp.py FLASH
# Prints HEAP (the heap's bytes), SET (the thresholds Session() set, in order) and AFTER.
import gc
import sys

import mf_session

calls = []
real = mf_session._threshold


def spy(*a):
    if a:
        calls.append(a[0])
    return real(*a)


mf_session._threshold = spy
before = gc.threshold()
mf_session.Session(root=sys.argv[1], verbose=False)
print("HEAP", gc.mem_alloc() + gc.mem_free())
print("SET", " ".join(str(c) for c in calls))
print("AFTER", gc.threshold() == before)
