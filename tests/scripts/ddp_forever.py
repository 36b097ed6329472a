"""A job that trains until it is cancelled."""

import time

import torch.distributed as dist

dist.init_process_group("gloo")
print(f"training rank {dist.get_rank()}", flush=True)
while True:
    time.sleep(0.5)
