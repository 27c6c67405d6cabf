"""Other toolkits' own beam search on our weights, for the search-rules oracles
(``tests/test_search_rules.py``): transformers' ``generate`` on our Hugging Face export
(``to_marian``, in memory), CTranslate2's ``translate_batch`` on our CTranslate2 export, fairseq's
``SequenceGenerator`` on our model in fairseq's interpreter (``fairseq_search.py``), each with
beam 4 and alpha 0.6, and ours under each rule of ``aiayn.decode.rules.SEARCH_RULES``.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from aiayn.decode import DecodeConfig, SearchRequest, decode_ids
from aiayn.decode.rules import SEARCH_RULES, SearchRules

HERE = Path(__file__).resolve().parent
BEAM, ALPHA = 4, 0.6
HF_MAX_LEN, CT2_MAX_LEN = SEARCH_RULES["hf"].max_len, SEARCH_RULES["ct2"].max_len


def ours(model: Any, sources: Sequence[list[int]], rules: SearchRules) -> list[list[int]]:
    """Our search's best output of each source (ids with eos), under ``rules``."""
    config = DecodeConfig(beam=BEAM, alpha=ALPHA, rules=rules)
    return [h[0].tokens if h else [] for h in decode_ids(model, sources, SearchRequest(config))]


def hf_outputs(
    model: Any,
    sources: Sequence[list[int]],
    max_len: int = HF_MAX_LEN,
    batch: int = 32,
    **options: Any,
) -> list[list[int]]:
    """transformers' beam search (``generate``, ``early_stopping=False``, ``max_length``
    ``max_len`` + 1: it counts the decoder's start) on our model exported to MarianMT: each
    source's best output, eos removed. ``options``: more of ``generate``'s (e.g. the
    repetition guards)."""
    from aiayn.export.hf import to_marian

    marian = to_marian(model, DecodeConfig(beam=BEAM, alpha=ALPHA))
    pad, eos = marian.config.pad_token_id, marian.config.eos_token_id
    outputs: list[list[int]] = [[] for _ in sources]
    order = sorted((i for i, s in enumerate(sources) if s), key=lambda i: -len(sources[i]))
    for start in range(0, len(order), batch):
        members = order[start : start + batch]
        width = max(len(sources[i]) for i in members)
        ids = torch.full((len(members), width), pad, dtype=torch.long)  # (b, width)
        for row, i in enumerate(members):
            ids[row, : len(sources[i])] = torch.tensor(sources[i])
        with torch.no_grad():
            generated = marian.generate(
                input_ids=ids,
                attention_mask=ids != pad,
                num_beams=BEAM,
                length_penalty=ALPHA,
                early_stopping=False,
                max_length=max_len + 1,
                **options,
            )
        for i, row in zip(members, generated.tolist()):
            row = row[1:]  # without the start token (bos)
            outputs[i] = row[: row.index(eos)] if eos in row else [t for t in row if t != pad]
    return outputs


def ct2_outputs(
    model: Any,
    vocab: Any,
    sources: Sequence[list[int]],
    workdir: Path,
    max_len: int = CT2_MAX_LEN,
    **options: Any,
) -> list[list[int]]:
    """CTranslate2's beam search (``translate_batch`` with its defaults but beam, length
    penalty and ``max_decoding_length``: patience 1, eos not returned) on our model exported
    to ``workdir``; pad and bos suppressed, as our search forbids them. ``options``: more of
    ``translate_batch``'s, or other values for those (e.g. ``beam_size``)."""
    import ctranslate2

    from aiayn.export.ctranslate2 import export_ctranslate2

    out = export_ctranslate2(model, vocab, workdir / "ct2")
    threads = torch.get_num_threads()
    translator = ctranslate2.Translator(str(out), compute_type="float32", intra_threads=threads)
    pieces = [[vocab.id_to_piece(i) for i in s[:-1]] for s in sources]  # it appends eos
    given = dict(
        beam_size=BEAM,
        length_penalty=ALPHA,
        max_decoding_length=max_len,
        suppress_sequences=[[vocab.id_to_piece(vocab.pad_id)], [vocab.id_to_piece(vocab.bos_id)]],
        max_batch_size=32,
    )
    results = translator.translate_batch([p for p in pieces if p], **{**given, **options})
    found = iter(results)
    return [[vocab.piece_to_id(p) for p in next(found).hypotheses[0]] if p else [] for p in pieces]


def fairseq_outputs(
    python: str, checkpoint: str, sources: Sequence[list[int]], workdir: Path
) -> list[list[int]]:
    """fairseq's SequenceGenerator on our model (``fairseq_search.py`` in ``python``)."""
    given, out = workdir / "sources.json", workdir / "fairseq.json"
    given.write_text(json.dumps(list(sources)), encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=str(HERE.parent / "src"))
    threads = str(torch.get_num_threads())
    command = [python, str(HERE / "fairseq_search.py"), checkpoint, str(given), str(out)]
    command += ["--beam", str(BEAM), "--lenpen", str(ALPHA), "--threads", threads]
    subprocess.run(command, check=True, env=env)
    return json.loads(out.read_text(encoding="utf-8"))
