"""A worker that builds its own torch.distributed group (not erun.torch's)
and then raises: under erun the job must end with the traceback shown."""
import os
import socket

import torch
import torch.distributed as dist

import erun

erun.init()
with socket.socket() as s:  # a free port for this world of one
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
t = torch.ones(3)
dist.all_reduce(t)
print(f"pid {os.getpid()}: own group up, sum {float(t.sum())}", flush=True)
raise ValueError("user error with its own group up")
