"""A tiny Transformer learns algorithmic transductions: the model trains end to end."""

import pytest
import torch
import torch.nn.functional as F

from aiayn import ModelConfig, Transformer
from aiayn.decode.cache import decode_step, new_cache

PAD, BOS, EOS = 0, 2, 3
VOCAB = 14  # ids 4..13 are symbols


def sample(n: int, g: torch.Generator, length: int = 6) -> torch.Tensor:
    return torch.randint(4, VOCAB, (n, length), generator=g)


def greedy(model: Transformer, src: torch.Tensor, steps: int) -> torch.Tensor:
    cache = new_cache(model, model.encode(src), model.src_mask(src))
    token, out = torch.full((src.size(0), 1), BOS), []
    for _ in range(steps):
        logits = decode_step(model, token, cache)
        token = logits.argmax(-1, keepdim=True)
        out.append(token)
    return torch.cat(out, dim=1)


def exact_match(model: Transformer, task: str, seed: int) -> float:
    seq = sample(200, torch.Generator().manual_seed(seed))
    target = seq if task == "copy" else seq.flip(1)
    model.eval()
    with torch.no_grad():
        out = greedy(model, torch.cat([seq, torch.full((200, 1), EOS)], 1), steps=7)
    model.train()
    hit = (out[:, :6] == target).all(1) & (out[:, 6] == EOS)
    return hit.float().mean().item()


@pytest.mark.parametrize("task", ["copy", "reverse"])
def test_tiny_model_learns_task_exactly(task):
    """Train until a validation sample is decoded perfectly at two checks in a row (at most
    1,000 updates, usually 200-350), then require 100% exact match on a separate test sample."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    cfg = ModelConfig(
        N_enc=2, N_dec=2, d_model=64, d_ff=128, h=4, P_drop=0.0, vocab_size=VOCAB, max_len=32
    )
    model = Transformer(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.98), eps=1e-9)
    eos = torch.full((64, 1), EOS)
    perfect = 0
    for step in range(1000):
        seq = sample(64, g)
        target = seq if task == "copy" else seq.flip(1)
        src = torch.cat([seq, eos], 1)
        tgt_in = torch.cat([torch.full((64, 1), BOS), target], 1)
        tgt_out = torch.cat([target, eos], 1)
        for group in opt.param_groups:  # short linear warm-up keeps post-LN stable
            group["lr"] = 3e-3 * min(1.0, (step + 1) / 50)
        loss = F.cross_entropy(model(src, tgt_in).flatten(0, 1), tgt_out.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 49:  # stop after two perfect checks in a row: one can be luck at the margin
            perfect = perfect + 1 if exact_match(model, task, seed=7) == 1.0 else 0
            if perfect == 2:
                break
    assert exact_match(model, task, seed=123) == 1.0
