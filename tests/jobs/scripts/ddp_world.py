"""Two processes, one gloo all-reduce: each rank prints the world it sees."""

import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
total = torch.ones(1)
dist.all_reduce(total)
print(f"WORLD_SIZE={os.environ['WORLD_SIZE']} RANK={dist.get_rank()} sum={int(total.item())} "
      f"SM_CURRENT_HOST={os.environ['SM_CURRENT_HOST']}", flush=True)
if dist.get_rank() == 0:
    with open(os.path.join(os.environ["SM_MODEL_DIR"], "world.txt"), "w") as out:
        out.write(os.environ["WORLD_SIZE"])
dist.barrier()
dist.destroy_process_group()
