"""Beam search output pinned to golden n-best lists from the implementation before the speed work.

The fixture ``decode_golden.json`` was written by running this file as a script
(``python tests/test_decode_golden.py``) on the beam search of commit ff6f379, before the
decoder was rewritten for speed (issue 13). Any later change to the search or the cache must
reproduce these token ids exactly; scores may move in the last float digits only (the
arithmetic is reordered), hence the 1e-4 tolerance.

The cases cover what the rewrite touches: sentences of different lengths in one batch that
finish at different steps and leave the batch, n-best > 1, outputs cut at the maximum length,
a forced minimum length, restricted self-attention, pre-LN, a prefix constraint, and greedy. Each case runs on the model as trained and on its weights
packed for oneDNN (``aiayn.runtime.packed``, what ``translate`` decodes with on the CPU): the
matmuls sum in another order, and the outputs must still be the golden ones.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

import aiayn
from aiayn.decode import Batching, DecodeConfig, SearchRequest, decode_ids, for_decoding
from aiayn.runtime import packed

PAD, EOS = 0, 3
FIXTURE = Path(__file__).with_name("decode_golden.json")


class EvenAfterThree:
    """A toy constraint: after the third output token only even ids (and eos) may follow."""

    def start(self, source, max_len):
        return 0

    def allowed(self, state):
        return range(4, 100) if state < 3 else [EOS, *range(4, 100, 2)]

    def advance(self, state, token):
        return state + 1


CASES = {
    "beam4_nbest4": dict(
        model={}, decode=dict(beam=4, alpha=0.6, max_len_a=0.5, max_len_b=8, nbest=4)
    ),
    "beam5_nbest2_long": dict(
        model={}, decode=dict(beam=5, alpha=1.0, max_len_a=1.0, max_len_b=12, nbest=2)
    ),
    "beam4_alpha0_nbest3": dict(
        model={}, decode=dict(beam=4, alpha=0.0, max_len_a=1.0, max_len_b=10, nbest=3)
    ),
    "min_len6": dict(
        model={}, decode=dict(beam=4, alpha=0.6, max_len_a=0.0, max_len_b=9, nbest=2), min_len=6
    ),
    "window2": dict(
        model={"attention_window": 2},
        decode=dict(beam=3, alpha=0.6, max_len_a=1.0, max_len_b=10, nbest=3),
    ),
    "pre_ln": dict(
        model={"norm": "pre"}, decode=dict(beam=4, alpha=0.6, max_len_a=1.0, max_len_b=10, nbest=2)
    ),
    "constrained": dict(
        model={},
        decode=dict(beam=4, alpha=0.6, max_len_a=1.0, max_len_b=10, nbest=2),
        constraint=True,
    ),
    "greedy": dict(model={}, decode=dict(beam=1, alpha=0.6, max_len_a=1.0, max_len_b=10, nbest=1)),
}


def golden_model(overrides: dict) -> aiayn.Transformer:
    """The tiny preset with seeded random weights; eos made likely so that outputs end early.
    The weights are drawn as when the golden ids were made (init "xavier", the default then)."""
    torch.manual_seed(0)
    model = aiayn.Transformer(aiayn.ModelConfig.preset("tiny", **overrides), init="xavier").eval()
    with torch.no_grad():
        model.src_embed.tokens.weight[EOS] *= 6.0
    return model


def golden_sources(n: int = 11, seed: int = 1) -> list[list[int]]:
    """n sources of lengths 2..12 (eos last), in an order that is not sorted by length."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randperm(n, generator=g).add(2).tolist()
    return [torch.randint(4, 100, (L - 1,), generator=g).tolist() + [EOS] for L in lengths]


def run_case(case: dict, pack: bool = False) -> list[list[dict]]:
    request = SearchRequest(
        DecodeConfig(**case["decode"]),
        min_len=case.get("min_len", 0),
        constraints=EvenAfterThree() if case.get("constraint") else None,
        batching=Batching(batch_size=4),
    )
    model = golden_model(case["model"])
    if pack:
        model = for_decoding(model)
        assert any(isinstance(m, packed.PackedLinear) for m in model.modules())
    nbest = decode_ids(model, golden_sources(), request)
    return [
        [{"tokens": h.tokens, "score": h.score, "length": h.length} for h in hyps] for hyps in nbest
    ]


@pytest.mark.parametrize("pack", [False, True], ids=["as-trained", "packed"])
@pytest.mark.parametrize("name", list(CASES))
def test_nbest_equals_golden(name, pack):
    if pack and not packed.available():
        pytest.skip("this PyTorch has no oneDNN linear ops: decoding runs unpacked")
    golden = json.loads(FIXTURE.read_text())[name]
    out = run_case(CASES[name], pack)
    assert [[h["tokens"] for h in hyps] for hyps in out] == [
        [h["tokens"] for h in hyps] for hyps in golden
    ]
    assert [[h["length"] for h in hyps] for hyps in out] == [
        [h["length"] for h in hyps] for hyps in golden
    ]
    for hyps, gold in zip(out, golden):
        assert [h["score"] for h in hyps] == pytest.approx([h["score"] for h in gold], abs=1e-4)


def test_golden_cases_exercise_the_search():
    """The fixture is only worth pinning if sentences end at different steps and n-best is full."""
    golden = json.loads(FIXTURE.read_text())
    lengths = {h[0]["length"] for h in golden["beam4_nbest4"]}
    assert len(lengths) >= 3
    assert all(len(hyps) == 4 for hyps in golden["beam4_nbest4"])
    min_len = [h["length"] for hyps in golden["min_len6"] for h in hyps]
    assert min(min_len) == 6 and max(min_len) == 9  # eos held back to 6; some cut at the limit
    assert {h[0]["length"] for h in golden["window2"]} >= {2, 22}


if __name__ == "__main__":
    # Regenerate only from a known-good implementation (see the module docstring).
    if "--write" not in sys.argv:
        sys.exit("usage: python tests/test_decode_golden.py --write  (overwrites the fixture)")
    FIXTURE.write_text(
        json.dumps({name: run_case(case) for name, case in CASES.items()}, indent=1) + "\n"
    )
    print(f"wrote {FIXTURE}")
