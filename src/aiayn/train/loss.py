"""Label-smoothed cross-entropy (section 5.4, eps_ls = 0.1), without a smoothed target tensor.

With eps = eps_ls and V classes, the smoothed target puts 1 - eps on the reference and eps / V
on every class (PyTorch's ``label_smoothing``), so for one position with logits x:

    loss = (1 - eps) * (lse(x) - x_t) + eps * (lse(x) - mean(x)) = lse(x) - (1 - eps) x_t - eps mean(x)
    d loss / d x = softmax(x) - (1 - eps) onehot(t) - eps / V

Forward is one fused log_softmax, a gather and a mean (no smoothed target, no (N, V) one-hot);
backward is two passes over one (N, V) buffer: exp(log p), then one multiply-add, and a scatter
for the reference class. ``F.cross_entropy`` needs about twice the (N, V) passes in backward. The result equals
``F.cross_entropy(x, t, label_smoothing=eps, ignore_index=..., reduction="sum")``.

Logits in bf16 or fp16 (mixed precision) are computed on in fp32 inside: one fp32 buffer takes
the cast, then the log-probabilities in place, then the gradient in place, which comes back in
the logits' dtype. The arithmetic is that of casting first (``logits.float()``), bit for bit,
in two fewer (N, V) buffers and without a separate cast node on each side; the price is that
such a graph cannot be back-propagated twice (``retain_graph``).
"""

from __future__ import annotations

import torch
from torch import Tensor


class _LabelSmoothedNLL(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, eps: float, ignore_index: int):
        valid = target != ignore_index
        t = target.masked_fill(~valid, 0).unsqueeze(1)  # (N, 1), ignored rows read class 0
        if logits.dtype in (torch.bfloat16, torch.float16):
            logp = logits.float()  # (N, V), a buffer of our own: log-probabilities in place
            torch.log_softmax(logp, dim=-1, out=logp)
        else:
            logp = torch.log_softmax(logits, dim=-1)  # (N, V)
        w = valid.to(logp.dtype)  # 1 or 0 per row: cast once, not in every product with it
        nll = -logp.gather(1, t).squeeze(1) * w
        smooth = -logp.mean(dim=-1) * w  # -mean_j log p_j
        ctx.save_for_backward(logp, t, w)
        ctx.eps, ctx.dtype = eps, logits.dtype
        return ((1 - eps) * nll + eps * smooth).sum(), nll.sum()

    @staticmethod
    def backward(ctx, g_loss: Tensor, g_nll: Tensor):
        logp, t, w = ctx.saved_tensors
        eps, V = ctx.eps, logp.size(-1)
        g_loss = logp.new_zeros(()) if g_loss is None else g_loss
        g_nll = logp.new_zeros(()) if g_nll is None else g_nll
        coef_p = (w * (g_loss + g_nll)).unsqueeze(1)  # on softmax
        coef_t = (w * ((1 - eps) * g_loss + g_nll)).unsqueeze(1)  # on the reference class
        coef_u = (w * (g_loss * eps / V)).unsqueeze(1)  # on every class
        # softmax, in a new (N, V) buffer, or for low-precision logits in the log-probabilities'
        # own (a second backward through the graph then fails on its version counter)
        grad = logp.exp_() if ctx.dtype in (torch.bfloat16, torch.float16) else logp.exp()
        grad = torch.addcmul(coef_u.neg(), grad, coef_p, out=grad)
        grad.scatter_add_(1, t, coef_t.neg())
        return grad.to(ctx.dtype), None, None, None


def label_smoothed_nll(
    logits: Tensor, target: Tensor, eps_ls: float, ignore_index: int = -100
) -> tuple[Tensor, Tensor]:
    """logits (N, V), target (N,) -> (label-smoothed loss summed, NLL summed), both scalars,
    in fp32 for bf16 or fp16 logits (no need to cast them first), else in the logits' dtype.

    Positions whose target is ``ignore_index`` contribute nothing. The NLL sum (no smoothing)
    is for perplexity; the loss sum is what is minimised (divide by the target token count).
    """
    return _LabelSmoothedNLL.apply(logits, target, float(eps_ls), int(ignore_index))


def teacher_forced(
    model: torch.nn.Module, src: Tensor, tgt_in: Tensor, tgt_out: Tensor, pad_id: int, eps_ls: float
) -> tuple[Tensor, Tensor, int]:
    """(label-smoothed loss sum, NLL sum, target tokens) of one batch, teacher-forced: the one
    yardstick behind every validation perplexity (the trainer's and ``aiayn evaluate``'s).

    src (B, S), tgt_in (B, T) = bos + subwords, tgt_out (B, T) = subwords + eos, pad elsewhere.
    """
    mask = tgt_out != pad_id  # (B, T)
    logits = model(src, tgt_in, output_mask=mask)  # (n_tokens, V): padding is never projected
    loss, nll = label_smoothed_nll(logits, tgt_out[mask], eps_ls)
    return loss, nll, int(mask.sum())


def perplexity(nll_sum: float, tokens: int) -> float:
    """exp(mean NLL per subword); capped so an untrained model does not overflow."""
    return float(torch.exp(torch.tensor(min(nll_sum / max(tokens, 1), 50.0))))
