"""Table 1 measured: forward time and peak memory of one layer of each type, against n.

    aiayn experiment table1 --budget seconds=180 --budget threads=1

Layers at d = 512 (the paper's d_model), batch 1, sequence length n = 16, 32, ... 4096 while
the time budget lasts: the model's multi-head self-attention (h = 8, fused kernel), its
restricted self-attention (``attention_window`` r, a masked n x n score matrix), a banded
restricted self-attention (only the 2r + 1 scores a query may see: Table 1's O(r n d)), an
LSTM, a convolution with k = 3 and a separable one (depthwise k = 3, then pointwise). Layer
types are timed interleaved at each n (the best of a few rounds), so a moment of CPU
contention hits all of them; peak memory is the largest sum of live tensor bytes allocated
inside one forward, read from the PyTorch profiler. Sequential operations and maximum path
lengths are computed, as in the paper. The report gives the measured n at which
self-attention becomes slower than the recurrent layer, against the paper's "n < d".
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.profiler import ProfilerActivity, profile

from ..config import ModelConfig
from ..model import MultiHeadAttention, attention_mask
from .runner import Budget, Experiment, Row
from .tables import markdown_table

D, H, K, R = 512, 8, 3, 16  # representation size, heads, kernel width, restricted radius
LENGTHS = [16 * 2**i for i in range(9)]  # 16 .. 4096
KINDS = [
    "self-attention",
    "restricted (mask)",
    "restricted (banded)",
    "recurrent (LSTM)",
    "convolutional",
    "separable conv",
]
COMPLEXITY = {
    "self-attention": "O(n^2 d)",
    "restricted (mask)": "O(n^2 d) as implemented",
    "restricted (banded)": "O(r n d)",
    "recurrent (LSTM)": "O(n d^2)",
    "convolutional": "O(k n d^2)",
    "separable conv": "O(k n d + n d^2)",
}


class SelfAttention(nn.Module):
    """The model's multi-head self-attention, optionally restricted by its window mask."""

    def __init__(self, window: int | None = None) -> None:
        super().__init__()
        self.attn = MultiHeadAttention(
            ModelConfig(d_model=D, h=H, vocab_size=8), self_attention=True
        )
        self.window = window

    def forward(self, x: Tensor) -> Tensor:
        n = x.size(1)
        mask = attention_mask(n, n, x.device, window=self.window) if self.window else None
        return self.attn(x, mask)


class BandedSelfAttention(SelfAttention):
    """Restricted self-attention computing only the 2r + 1 scores per query, O(r n d).

    Written here, not in the model, because it exists to measure Table 1's claim: the model's
    ``attention_window`` masks a full score matrix, which keeps the fused kernel and costs what
    full attention costs. Same weights and arithmetic as the masked layer (tested equal).
    """

    def forward(self, x: Tensor) -> Tensor:
        a, r = self.attn, self.window or R
        B, n, _ = x.shape
        q, k, v = a.W_QKV(x).split([a.h * a.d_k, a.h * a.d_k, a.h * a.d_v], dim=-1)
        q, k, v = a.heads(q, a.d_k), a.heads(k, a.d_k), a.heads(v, a.d_v)  # (B, h, n, d)
        # Neighbourhoods: pad r each side, then a sliding window of 2r + 1 positions.
        k = F.pad(k, (0, 0, r, r)).unfold(2, 2 * r + 1, 1)  # (B, h, n, d_k, 2r+1)
        v = F.pad(v, (0, 0, r, r)).unfold(2, 2 * r + 1, 1)  # (B, h, n, d_v, 2r+1)
        scores = torch.einsum("bhnd,bhndw->bhnw", q, k) * a.scale  # (B, h, n, 2r+1)
        offset = torch.arange(n, device=x.device)[:, None] + torch.arange(
            -r, r + 1, device=x.device
        )
        scores = scores.masked_fill((offset < 0) | (offset >= n), float("-inf"))  # padding keys
        out = torch.einsum("bhnw,bhndw->bhnd", torch.softmax(scores, dim=-1), v)  # (B, h, n, d_v)
        return a.W_O(out.transpose(1, 2).reshape(B, n, a.h * a.d_v))


class Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(D, D, batch_first=True)

    def forward(self, x: Tensor) -> Tensor:
        return self.lstm(x)[0]


class Convolution(nn.Module):
    """k = 3 over positions, padded to keep n; ``separable``: depthwise then pointwise."""

    def __init__(self, separable: bool) -> None:
        super().__init__()
        if separable:
            self.conv: nn.Module = nn.Sequential(
                nn.Conv1d(D, D, K, padding=K // 2, groups=D), nn.Conv1d(D, D, 1)
            )
        else:
            self.conv = nn.Conv1d(D, D, K, padding=K // 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(x.transpose(1, 2)).transpose(1, 2)  # (B, n, d) -> (B, d, n) -> back


def build_layers() -> dict[str, nn.Module]:
    torch.manual_seed(0)
    full, banded = SelfAttention(), BandedSelfAttention(window=R)
    banded.attn = full.attn  # the same weights: the three attention layers differ only in reach
    layers = {
        "self-attention": full,
        "restricted (mask)": SelfAttention(window=R),
        "restricted (banded)": banded,
        "recurrent (LSTM)": Recurrent(),
        "convolutional": Convolution(separable=False),
        "separable conv": Convolution(separable=True),
    }
    layers["restricted (mask)"].attn = full.attn
    return {name: layer.eval() for name, layer in layers.items()}


def flops(kind: str, n: int) -> float:
    """Multiply-adds x 2 of one forward (projections included), for the report."""
    attn = 4 * n * D * D  # W_QKV and W_O
    return (
        2.0
        * {
            "self-attention": attn + 2 * n * n * D,
            "restricted (mask)": attn + 2 * n * n * D,
            "restricted (banded)": attn + 2 * n * (2 * R + 1) * D,
            "recurrent (LSTM)": 8 * n * D * D,
            "convolutional": K * n * D * D,
            "separable conv": K * n * D + n * D * D,
        }[kind]
    )


def sequential_ops(kind: str, n: int) -> int:
    return n if kind == "recurrent (LSTM)" else 1


def max_path_length(kind: str, n: int) -> int:
    """Longest path between two of n positions (Table 1); convolutions dilated, as the paper's
    O(log_k n) assumes (contiguous kernels would need n / k layers)."""
    if kind.startswith("restricted"):
        return math.ceil((n - 1) / R)
    if kind == "recurrent (LSTM)":
        return n - 1
    if kind in ("convolutional", "separable conv"):
        return math.ceil(math.log(n, K))
    return 1


@torch.no_grad()
def peak_bytes(layer: nn.Module, x: Tensor) -> int:
    """Largest sum of bytes allocated and not yet freed during one forward (profiler events
    in time order: allocations are ops' self memory, frees are negative ``[memory]`` events)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        layer(x)
    live = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        live += event.self_cpu_memory_usage
        peak = max(peak, live)
    return peak


@torch.no_grad()
def time_layers(layers: dict[str, nn.Module], x: Tensor, rounds: int = 3) -> dict[str, float]:
    """Best seconds per forward of each layer, the layers interleaved in every round."""
    number = {}
    for name, layer in layers.items():  # warm-up, and how many calls make ~20 ms
        start = time.perf_counter()
        layer(x)
        number[name] = max(1, int(0.02 / max(time.perf_counter() - start, 1e-6)))
    best = {name: math.inf for name in layers}
    for _ in range(rounds):
        for name, layer in layers.items():
            start = time.perf_counter()
            for _ in range(number[name]):
                layer(x)
            best[name] = min(best[name], (time.perf_counter() - start) / number[name])
    return best


def measure(layers: dict[str, nn.Module], n: int) -> dict[str, Any]:
    x = torch.randn(1, n, D)
    seconds = time_layers(layers, x)
    return {
        "n": n,
        "layers": {
            name: {
                "ms": seconds[name] * 1e3,
                "peak_mb": peak_bytes(layer, x) / 2**20,
                "gflops": flops(name, n) / 1e9,
                "sequential_ops": sequential_ops(name, n),
                "max_path_length": max_path_length(name, n),
            }
            for name, layer in layers.items()
        },
    }


def plan(budget: Budget, out: Path, lengths: list[int] = LENGTHS) -> Experiment:
    deadline = time.monotonic() + budget.seconds
    state: dict[str, Any] = {"last_s": 0.0}
    layers: dict[str, nn.Module] = {}

    def row(n: int) -> Callable[[], dict[str, Any] | None]:
        def run() -> dict[str, Any] | None:
            # Doubling n at most quadruples a row's time (attention is quadratic).
            if time.monotonic() + 4 * state["last_s"] > deadline:
                return None
            torch.set_num_threads(budget.threads)
            if not layers:
                layers.update(build_layers())
            start = time.monotonic()
            result = measure(layers, n)
            state["last_s"] = time.monotonic() - start
            return result

        return run

    return Experiment(
        name="table1",
        rows=[Row(f"n={n}", row(n), cost=float(n * n + 64 * n)) for n in lengths],
        report=report,
        plot=plot,
        budget_keys=("threads",),
        inputs={"d": D, "h": H, "k": K, "r": R},
    )


def crossover(rows: list[dict[str, Any]], a: str, b: str) -> float | None:
    """Smallest n where layer ``a`` becomes slower than ``b``, interpolated log-log between
    the measured lengths; None when it never does in the measured range."""
    ratios = [(r["n"], r["layers"][a]["ms"] / r["layers"][b]["ms"]) for r in rows]
    for (n0, q0), (n1, q1) in zip(ratios, ratios[1:]):
        if q0 <= 1.0 < q1:
            t = (0.0 - math.log(q0)) / (math.log(q1) - math.log(q0))
            return math.exp(math.log(n0) + t * (math.log(n1) - math.log(n0)))
    if ratios and ratios[0][1] > 1.0:
        return float(ratios[0][0])
    return None


def report(rows: list[dict[str, Any]]) -> str:
    n_max = rows[-1]["n"]
    last = rows[-1]["layers"]
    table1 = markdown_table(
        [
            "layer",
            "complexity",
            f"sequential ops (n={n_max})",
            f"max path length (n={n_max})",
            f"forward ms (n={n_max})",
            f"peak MB (n={n_max})",
        ],
        [
            [
                k,
                COMPLEXITY[k],
                last[k]["sequential_ops"],
                last[k]["max_path_length"],
                last[k]["ms"],
                last[k]["peak_mb"],
            ]
            for k in KINDS
        ],
    )
    times = markdown_table(
        ["n"] + KINDS, [[r["n"]] + [r["layers"][k]["ms"] for k in KINDS] for r in rows]
    )
    memory = markdown_table(
        ["n"] + KINDS, [[r["n"]] + [r["layers"][k]["peak_mb"] for k in KINDS] for r in rows]
    )
    measured = crossover(rows, "self-attention", "recurrent (LSTM)")
    by_flops = next(
        (
            r["n"]
            for r in rows
            if flops("self-attention", r["n"]) > flops("recurrent (LSTM)", r["n"])
        ),
        None,
    )
    verdict = (
        f"measured: self-attention becomes slower than the LSTM at n ~ {measured:.0f}"
        if measured
        else f"measured: self-attention stays faster than the LSTM up to n = {n_max}"
    )
    return "\n\n".join(
        [
            f"d = {D}, h = {H}, k = {K}, r = {R}, batch 1, forward only, fp32.",
            "## Table 1, measured\n\n" + table1,
            "## Forward time (ms, best of 3 interleaved rounds)\n\n" + times,
            "## Peak memory inside one forward (MB of tensors, PyTorch profiler)\n\n" + memory,
            "## Where self-attention gets slower than recurrence\n\n"
            f"- paper: self-attention is cheaper when n < d = {D} (n^2 d against n d^2);\n"
            f"- counting the projections too (4 n d^2 + 2 n^2 d against 8 n d^2), FLOPs cross at n = 2d = {2 * D}"
            + (f" (first measured n with more FLOPs: {by_flops})" if by_flops else "")
            + ";\n"
            f"- {verdict}.",
        ]
    )


def plot(rows: list[dict[str, Any]], out: Path) -> list[Path]:
    from ..analysis.plots import plt, save_figure

    ns = [r["n"] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for kind in KINDS:
        axes[0].plot(ns, [r["layers"][kind]["ms"] for r in rows], marker="o", label=kind)
        axes[1].plot(
            ns, [max(r["layers"][kind]["peak_mb"], 1e-3) for r in rows], marker="o", label=kind
        )
    axes[0].axvline(D, color="grey", ls="--", lw=1, label="n = d (paper's crossover)")
    for ax, ylabel, title in (
        (axes[0], "forward time (ms)", "time per layer"),
        (axes[1], "peak tensor memory (MB)", "memory per layer"),
    ):
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="sequence length n",
            ylabel=ylabel,
            title=f"{title}, d = {D}",
        )
        ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=7)
    return [save_figure(fig, out / "table1.png")]
