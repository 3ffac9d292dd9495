"""Start-up benchmark peer for torchrun: init a Gloo process group, one barrier."""
import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
if dist.get_rank() == 0:
    print(f"torch_startup: world={dist.get_world_size()} barrier done", flush=True)
dist.destroy_process_group()
