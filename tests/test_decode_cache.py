"""The shared-history cache of incremental decoding (aiayn.decode.cache): each step's logits are
the full forward's, through beams that reorder, fan out and leave, with keys written once."""

from functools import partial

import pytest
import torch
from _tiny_models import VARIANTS, batch
from _tiny_models import make as make_paper

from aiayn.decode.cache import decode_step, new_cache

make = partial(make_paper, fast=True)  # the fast paths, as training and decoding run the model


@pytest.mark.parametrize("overrides", VARIANTS)
def test_cached_decode_step_reproduces_forward(overrides):
    model = make(**overrides)
    src, tgt = batch()
    full = model(src, tgt)  # (B, T, V)
    memory, mask = model.encode(src), model.src_mask(src)
    cache = new_cache(model, memory, mask)
    for layer in cache.layers:  # the memory's keys stored (n, h, d, S), its values (n, h, S, d)
        assert layer.memory_keys.transpose(2, 3).is_contiguous()
        assert layer.memory_values.is_contiguous()
    for t in range(tgt.size(1)):
        logits = decode_step(model, tgt[:, t : t + 1], cache)
        assert torch.allclose(logits, full[:, t], atol=1e-5), f"step {t}"
    # Several tokens at once from an existing cache agree too.
    cache = new_cache(model, memory, mask)
    decode_step(model, tgt[:, :3], cache)
    logits = decode_step(model, tgt[:, 3:6], cache)
    assert torch.allclose(logits, full[:, 5], atol=1e-5)


def test_cache_select_reorders_rows():
    model = make()
    src, tgt = batch()
    cache = new_cache(model, model.encode(src), model.src_mask(src))
    decode_step(model, tgt[:, :4], cache)
    order = torch.tensor([2, 0])
    cache.select(order, sentences=order)
    logits = decode_step(model, tgt[order, 4:5], cache)
    assert torch.allclose(logits, model(src, tgt)[order, 4], atol=1e-5)


def test_cache_select_within_sentences_moves_no_key_or_value():
    model = make()
    src, tgt = batch()
    beams = torch.tensor([0, 0, 1, 1])  # two beams of sentences 0 and 1
    cache = new_cache(model, model.encode(src[:2]), model.src_mask(src[:2]))  # once per sentence
    prefix = tgt[beams].clone()
    prefix[1, :4] = torch.randint(4, 100, (4,))  # the beams of a sentence differ
    decode_step(model, prefix[:, :4], cache)
    held = [(layer.keys[:, :, :4].clone(), layer.memory_keys.data_ptr()) for layer in cache.layers]
    within = torch.tensor([1, 0, 3, 3])  # beams swap, or repeat, within their sentence
    cache.select(within)  # sentences=None: only the rows' ancestry is copied
    for layer, (keys, memory_keys) in zip(cache.layers, held):
        assert torch.equal(layer.keys[:, :, :4], keys)  # positions 0-3, where they were
        assert layer.memory_keys.data_ptr() == memory_keys
    logits = decode_step(model, prefix[within, 4:5], cache)
    assert torch.allclose(logits, model(src[beams], prefix[within, :5])[:, 4], atol=1e-5)


@pytest.mark.parametrize("overrides", [{}, {"attention_window": 2}, {"norm": "pre"}])
@pytest.mark.parametrize("gather", [False, True])
def test_cached_beams_that_reorder_and_leave_equal_the_full_forward(overrides, gather):
    """What beam search does to the cache, checked against a full forward at every step.

    Three sentences, the memory given once per sentence; the first step has one row per
    sentence, then each sentence has 3 beams whose parents are drawn at random within the
    sentence (reordering, duplicating, dropping beams), and sentences leave after steps 3 and 5.
    """
    model = make(**overrides)
    src, _ = batch()
    g = torch.Generator().manual_seed(5)
    sentences = torch.arange(3)  # original index of each sentence still decoding
    prefixes = torch.full((3, 1), 2)  # (n*b, t), bos
    b, k, T = 1, 3, 8
    leave = {3: 1, 5: 0}  # step -> the current index of the sentence that leaves after it
    cache, buffers = new_cache(model, model.encode(src), model.src_mask(src), max_len=T), []
    for step in range(T):
        logits = decode_step(model, prefixes[:, -1:], cache)
        full = model(src[sentences.repeat_interleave(b)], prefixes)[:, -1]
        assert torch.allclose(logits, full, atol=1e-5), f"step {step}"
        if step >= 1:  # after the fan-out, keys move only when a sentence leaves
            buffers.append(cache.layers[0].keys.data_ptr())
        n = sentences.numel()
        parents = torch.randint(0, b, (n, k), generator=g) + (torch.arange(n) * b)[:, None]
        keep = torch.tensor([i for i in range(n) if i != leave.get(step)])
        if gather and step in leave:  # the kept sentences reversed: not a tail-filling order
            keep = keep.flip(0) if keep.numel() > 1 else keep
        rows = parents[keep].reshape(-1)
        if step in leave:
            cache.select(rows, sentences=keep)
            sentences = sentences[keep]
        else:
            cache.select(rows)
        prefixes = torch.cat(
            [prefixes[rows], torch.randint(4, 100, (rows.numel(), 1), generator=g)], dim=1
        )
        b = k
    assert sentences.tolist() == ([0] if gather else [2])  # who left depends on the order
    # each leaving sentence's place taken by the last one (in place), or, for ``keep`` in any
    # other order, gathered into the spare buffer
    first, second = buffers[0], buffers[3]
    if gather:  # steps 1-3 in one buffer, 4-7 in the other (the last leave moved in place)
        assert buffers == [first] * 3 + [second] * 4 and first != second
    else:
        assert buffers == [first] * 7
