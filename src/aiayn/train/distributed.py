"""Data parallelism through torch.distributed, set up from torchrun's environment.

``torchrun --nproc_per_node 8 -m aiayn train cfg.yaml`` on one machine, or with
``--nnodes N --rdzv_backend c10d --rdzv_endpoint HOST:PORT`` on several: torchrun sets
RANK / WORLD_SIZE / LOCAL_RANK, and this module only reads them. gloo on CPU, nccl on GPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Distributed:
    rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def setup(device: str = "auto") -> Distributed:
    """Join the process group torchrun describes (if any) and pick this process's device."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda":
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
    return Distributed(rank, world_size, dev)


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
