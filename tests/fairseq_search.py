"""fairseq's own beam search (``SequenceGenerator``) on our model, run in fairseq's interpreter.

Our checkpoint is wrapped in fairseq's encoder-decoder interface rather than converted to a
fairseq transformer: the search is what is checked, and the wrapper hands fairseq exactly our
network's log-probabilities (the same code computes them, on the weights packed as ``aiayn
evaluate`` packs them), where a conversion would add its own chances of error (fairseq's
sinusoids are laid out [sin | cos] and its positions start after the padding index). The
wrapper's decoder is incremental (fairseq's ``FairseqIncrementalDecoder``): our model's own
cache (``aiayn.decode.cache``'s ``new_cache``, ``decode_step``) lives in fairseq's incremental state and
follows fairseq's reordering of the beams (``DecoderCache.select``), so a step costs one
position, as in our search. As in our search, bos is impossible after the softmax (fairseq
makes pad impossible).

    PYTHONPATH=src ../peersvenv/bin/python tests/fairseq_search.py CKPT SOURCES.json OUT.json \
        --beam 4 --lenpen 0.6

SOURCES.json: a list of id lists (each ending with eos); OUT.json: the best output of each
(ids, eos removed). fairseq's defaults otherwise: max_len_a 0, max_len_b 200, normalised scores.
Needs PYTHONPATH to hold this checkout's src/ (for the model) and torch, safetensors and
sentencepiece beside fairseq.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from fairseq.models import (
    FairseqEncoder,
    FairseqEncoderDecoderModel,
    FairseqIncrementalDecoder,
)
from fairseq.sequence_generator import SequenceGenerator

from aiayn.checkpoint import load_translator
from aiayn.decode import for_decoding
from aiayn.decode.cache import decode_step, new_cache

MAX_LEN_B = 200  # fairseq's default output limit (max_len_a 0): 200 tokens, then eos


class Ids:
    """The dictionary fairseq's generator asks for: our special ids and the vocabulary size."""

    def __init__(self, vocab: Any) -> None:
        self.vocab = vocab

    def pad(self) -> int:
        return self.vocab.pad_id

    def unk(self) -> int:
        return self.vocab.unk_id

    def eos(self) -> int:
        return self.vocab.eos_id

    def bos(self) -> int:
        return self.vocab.bos_id

    def __len__(self) -> int:
        return len(self.vocab)


class Encoder(FairseqEncoder):
    def __init__(self, model: Any, ids: Ids) -> None:
        super().__init__(ids)
        self.model = model

    def forward(self, src_tokens: torch.Tensor, src_lengths: torch.Tensor) -> dict[str, Any]:
        """src (B, S), right-padded as ours are -> memory (B, S, d) and its mask (B, 1, 1, S)."""
        return {"memory": self.model.encode(src_tokens), "mask": self.model.src_mask(src_tokens)}

    def reorder_encoder_out(self, out: dict[str, Any], new_order: torch.Tensor) -> dict[str, Any]:
        return {k: v.index_select(0, new_order) for k, v in out.items()}

    def max_positions(self) -> int:
        return self.model.cfg.max_len


class Decoder(FairseqIncrementalDecoder):
    """Our decoder one position a step: its cache is kept in fairseq's incremental state.

    fairseq's rows are sentence-major, ``beam`` per sentence, as our cache's are; the memory is
    the same in a sentence's rows (fairseq repeats it), so the cache takes one per sentence.
    """

    def __init__(self, model: Any, ids: Ids, beam: int) -> None:
        super().__init__(ids)
        self.model, self.beam = model, beam

    def forward(
        self,
        prev_output_tokens: torch.Tensor,
        encoder_out: dict[str, Any],
        incremental_state: dict[str, Any],
        **_: Any,
    ) -> tuple[torch.Tensor, None]:
        """prefixes (n*beam, t) -> logits (n*beam, 1, V) of the last position, the only one
        fed: the cache holds the t - 1 before it."""
        state = self.get_incremental_state(incremental_state, "cache")
        if state is None:  # the first step: the cache of each sentence's memory (n, S, d)
            memory, mask = encoder_out["memory"][:: self.beam], encoder_out["mask"][:: self.beam]
            state = {"cache": new_cache(self.model, memory, mask, max_len=MAX_LEN_B + 1)}
            self.set_incremental_state(incremental_state, "cache", state)
        cache = state["cache"]
        if cache.step != prev_output_tokens.size(1) - 1:
            raise RuntimeError(f"cache at {cache.step}, prefixes of {prev_output_tokens.size(1)}")
        return decode_step(self.model, prev_output_tokens[:, -1:], cache)[:, None], None

    def reorder_incremental_state(
        self, incremental_state: dict[str, Any], new_order: torch.Tensor
    ) -> None:
        """new_order (n'*beam,): row i becomes old row new_order[i], a row of the same
        sentence (fairseq reorders beams within a sentence and drops finished sentences)."""
        cache = self.get_incremental_state(incremental_state, "cache")["cache"]
        sentences = new_order[:: self.beam] // self.beam  # (n',) old sentence of each new one
        cache.select(new_order, None if new_order.numel() == cache.rows else sentences)

    def max_positions(self) -> int:
        return self.model.cfg.max_len


class Wrapped(FairseqEncoderDecoderModel):
    def __init__(self, model: Any, ids: Ids, beam: int) -> None:
        super().__init__(Encoder(model, ids), Decoder(model, ids, beam))
        self.bos = ids.bos()

    def get_normalized_probs(self, net_output: Any, log_probs: bool, sample: Any = None):
        lprobs = F.log_softmax(net_output[0].float(), dim=-1)
        lprobs[..., self.bos] = float("-inf")  # after the softmax, as ours
        return lprobs


def search(
    model: Any, vocab: Any, sources: list[list[int]], beam: int, lenpen: float, batch: int
) -> list[list[int]]:
    """Each source's best output by fairseq's SequenceGenerator (its defaults but beam and
    lenpen; decoding starts from our bos)."""
    ids = Ids(vocab)
    generator = SequenceGenerator(
        [Wrapped(model, ids, beam).eval()],
        ids,
        beam_size=beam,
        len_penalty=lenpen,
        max_len_b=MAX_LEN_B,
    )
    outputs: list[list[int]] = [[] for _ in sources]
    order = sorted(range(len(sources)), key=lambda i: -len(sources[i]))
    for start in range(0, len(order), batch):
        members = order[start : start + batch]
        width = max(len(sources[i]) for i in members)
        src = torch.full((len(members), width), vocab.pad_id, dtype=torch.long)
        for row, i in enumerate(members):
            src[row, : len(sources[i])] = torch.tensor(sources[i])
        lengths = (src != vocab.pad_id).sum(1)
        sample = {"net_input": {"src_tokens": src, "src_lengths": lengths}}
        with torch.no_grad():
            found = generator.generate(None, sample, bos_token=vocab.bos_id)
        for i, hypos in zip(members, found):
            tokens = hypos[0]["tokens"].tolist()
            outputs[i] = tokens[:-1] if tokens and tokens[-1] == vocab.eos_id else tokens
        print(f"fairseq: {min(start + batch, len(order))} / {len(order)}", file=sys.stderr)
    return outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("sources", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--lenpen", type=float, default=0.6)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, vocab = load_translator(args.checkpoint)
    sources = json.loads(args.sources.read_text(encoding="utf-8"))
    found = search(for_decoding(model.eval()), vocab, sources, args.beam, args.lenpen, args.batch)
    args.out.write_text(json.dumps(found), encoding="utf-8")


if __name__ == "__main__":
    main()
