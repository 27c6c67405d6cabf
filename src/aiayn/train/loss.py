"""Section 5.4: label-smoothed cross-entropy, padding excluded."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def label_smoothed_loss(logits: Tensor, target: Tensor, eps_ls: float) -> tuple[Tensor, Tensor]:
    """Summed smoothed loss and summed NLL over ``target`` (N,) for ``logits`` (N, V).

    The smoothed target puts 1 - eps_ls on the reference and eps_ls / V on every class (the
    definition of ``F.cross_entropy(label_smoothing=...)``). Padding positions are expected to
    be removed already (see ``Transformer.forward(output_mask=...)``). The NLL, which gives
    the perplexity, comes from the same log-softmax, so it costs no extra pass.
    """
    log_probs = F.log_softmax(logits.float(), dim=-1)
    nll = -log_probs.gather(-1, target[:, None]).squeeze(-1)
    if eps_ls == 0.0:
        loss = nll.sum()
    else:
        uniform = -log_probs.mean(dim=-1)
        loss = ((1.0 - eps_ls) * nll + eps_ls * uniform).sum()
    return loss, nll.detach().sum()


def perplexity(nll_sum: float, tokens: int) -> float:
    """exp(mean NLL per subword); capped so an untrained model does not overflow."""
    return float(torch.exp(torch.tensor(min(nll_sum / max(tokens, 1), 50.0))))
