"""A trivial gloo job: join the group, one all_reduce, leave."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
value = torch.ones(1)
dist.all_reduce(value)
assert value.item() == dist.get_world_size()
dist.destroy_process_group()
