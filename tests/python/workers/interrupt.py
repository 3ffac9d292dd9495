"""Ctrl-C during a blocked collective: rank 0 waits in a barrier that rank 1
joins only much later; a SIGINT to rank 0 must raise KeyboardInterrupt at
once, not after the collective timeout. Prints how long it took."""
import os
import sys
import time

import erun

erun.init()
if erun.rank() == 1:
    time.sleep(20)
    sys.exit(0)
print(f"pid {os.getpid()} waiting", flush=True)
t0 = time.monotonic()
try:
    erun.barrier()
    print("barrier returned", flush=True)
except KeyboardInterrupt:
    print(f"interrupted after {time.monotonic() - t0:.2f} s", flush=True)
