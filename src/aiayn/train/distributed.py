"""Data parallelism through torch.distributed, set up from torchrun's environment.

``torchrun --nproc_per_node 8 -m aiayn train cfg.yaml`` on one machine, or with
``--nnodes N --rdzv_backend c10d --rdzv_endpoint HOST:PORT`` on several: torchrun sets
RANK / WORLD_SIZE / LOCAL_RANK, and this module only reads them. gloo on CPU, nccl on GPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

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


def rng_states(d: Distributed) -> list[dict[str, torch.Tensor]]:
    """Every rank's RNG states, ``{"cpu": ..., "cuda": ...}`` ("cuda" on a GPU only), in rank
    order: each rank draws its own dropout masks, so each rank's states are saved.
    A collective: every rank calls it."""
    state = {"cpu": torch.get_rng_state()}
    if d.device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(d.device)
    if not d.enabled:
        return [state]
    gathered: list[Any] = [None] * d.world_size
    dist.all_gather_object(gathered, state)
    return gathered


def set_rng_states(saved: list[dict[str, torch.Tensor]], d: Distributed) -> None:
    """Restore this rank's states from ``rng_states``' list. A rank the saved run did not have
    keeps its own seed (another rank's would repeat its masks); a CUDA state needs a GPU."""
    if d.rank >= len(saved):
        return
    torch.set_rng_state(saved[d.rank]["cpu"])
    if "cuda" in saved[d.rank] and d.device.type == "cuda":
        torch.cuda.set_rng_state(saved[d.rank]["cuda"], d.device)


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
