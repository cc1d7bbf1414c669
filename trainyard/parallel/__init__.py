"""How one training job spreads its model over its processes: the process group
(processes), the steps every plan shares (steps), each process holding the whole model with
DDP averaging gradients (replicated), the model sharded (fsdp), or cut into stages
(pipeline, with the stage partitioner in partition).

Nothing is imported here: the partitioner is read without torch, the rest imports it.
"""
