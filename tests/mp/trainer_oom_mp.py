# A session fit that runs out of memory (test_trainer.py): the message names a micro-batch, the
# heap is back, the session's flags are as before, and a fit with that micro-batch runs.
#   trainer_oom_mp.py FLASH   (in a 420K heap on the 32-bit port)
import gc
import sys

import finetune

s = finetune.Session(root=sys.argv[1], verbose=False)
s.evaluate(verbose=False)
s.fit(epochs=1, data="train", batch_size=4, micro_batch=None, verbose=False)   # kernels, optimizer
s.plan(verbose=False)
gc.collect()
f0 = gc.mem_free()
flags = (s._opt.steps, s._fits, s._dirty, s.lr)
m = None
try:
    s.fit(epochs=1, data="train", batch_size=120, micro_batch=None, verbose=False)
except MemoryError as e:
    msg = str(e)
    i = msg.find("s.fit(micro_batch=")
    if i >= 0:
        m = int(msg[i + 18:msg.index(")", i)])
        print("OOM " + msg[i:msg.index(")", i) + 1])
    else:
        print("OOM without a micro-batch: " + msg)
    msg = e = None
gc.collect()
print("KEPT %d" % (f0 - gc.mem_free()))
print("FLAGS %s" % (flags == (s._opt.steps, s._fits, s._dirty, s.lr)))
if m:
    s.fit(epochs=1, data="train", batch_size=120, micro_batch=m, verbose=False)
    print("RETRY ok")
