"""Data parallelism through torch.distributed, set up from torchrun's environment.

``torchrun --nproc_per_node 8 -m aiayn train cfg.yaml`` on one machine, or with
``--nnodes N --rdzv_backend c10d --rdzv_endpoint HOST:PORT`` on several: torchrun sets
RANK / WORLD_SIZE / LOCAL_RANK, and this module only reads them. gloo on CPU, nccl on GPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ..errors import UserError

if TYPE_CHECKING:
    from .config import TrainConfig

# how far tokens_per_update may be from what whole micro-batches give, as a fraction of it
TOKENS_PER_UPDATE_TOLERANCE = 0.1


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


def update_freq(cfg: TrainConfig, world_size: int) -> int:
    """Micro-batches per process per update: ``cfg.update_freq``, or the number that gives
    ``cfg.tokens_per_update`` with ``world_size`` processes, so that a recipe means the same
    update on 1 GPU as on 8. A number that misses it by more than 10% is refused."""
    wanted = cfg.tokens_per_update
    if wanted is None:
        return cfg.update_freq
    per_micro_batch = cfg.max_tgt_tokens * world_size  # one micro-batch on every process
    freq = max(1, round(wanted / per_micro_batch))
    got = freq * per_micro_batch
    if abs(got - wanted) > TOKENS_PER_UPDATE_TOLERANCE * wanted:
        raise UserError(
            f"tokens_per_update={wanted} is not near a whole number of micro-batches: "
            f"{world_size} process(es) x max_tgt_tokens={cfg.max_tgt_tokens} x update_freq={freq} "
            f"= {got}, {abs(got - wanted) / wanted:.0%} off (at most 10%); change "
            "max_tgt_tokens, tokens_per_update or the number of processes"
        )
    return freq


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
