"""One model decoded under every toolkit's search rules, by ours and by the toolkit itself.

For each rule of ``aiayn.decode.rules.SEARCH_RULES`` (paper, fairseq, hf, ct2): the test split
decoded by our beam search under that rule (``aiayn evaluate --search-rules NAME``'s search),
and, for the other toolkits, by the toolkit's own search on the same weights, beam 4 and alpha
0.6 everywhere: transformers' ``generate`` on our Hugging Face export (``to_marian``, in
memory), CTranslate2's ``translate_batch`` on our CTranslate2 export, fairseq's
``SequenceGenerator`` on our model in fairseq's interpreter (``fairseq_search.py``, given
``--fairseq-python``; skipped without). Printed: the agreement of ours with the toolkit (equal
outputs, as ids), and SacreBLEU of each rule with its 95% interval and its paired
significance against the paper's rule (``aiayn.metrics.significance``, bootstrap and
approximate randomization).

    PYTHONPATH=src .venv/bin/python benchmarks/search_rules.py --checkpoint runs/demo/averaged \
        --threads 1 --fairseq-python /work/peersvenv/bin/python --json search_rules.json

The functions that run each toolkit (``hf_outputs``, ``ct2_outputs``, ``fairseq_outputs``) are
what ``tests/test_search_rules.py`` checks ours against on tiny models.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from aiayn.checkpoint import load_translator
from aiayn.data import bundled_corpus_paths
from aiayn.decode import DecodeConfig, SearchRequest, decode_ids, for_decoding
from aiayn.decode.rules import SEARCH_RULES, SearchRules
from aiayn.files import read_lines, write_lines_atomic
from aiayn.hardware import cpu_description
from aiayn.metrics.significance import significance

HERE = Path(__file__).resolve().parent
BEAM, ALPHA = 4, 0.6
HF_MAX_LEN, CT2_MAX_LEN = SEARCH_RULES["hf"].max_len, SEARCH_RULES["ct2"].max_len


def ours(model: Any, sources: Sequence[list[int]], rules: SearchRules) -> list[list[int]]:
    """Our search's best output of each source (ids with eos), under ``rules``."""
    config = DecodeConfig(beam=BEAM, alpha=ALPHA, rules=rules)
    return [h[0].tokens if h else [] for h in decode_ids(model, sources, SearchRequest(config))]


def hf_outputs(
    model: Any, sources: Sequence[list[int]], max_len: int = HF_MAX_LEN, batch: int = 32
) -> list[list[int]]:
    """transformers' beam search (``generate``, ``early_stopping=False``, ``max_length``
    ``max_len`` + 1: it counts the decoder's start) on our model exported to MarianMT: each
    source's best output, eos removed."""
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
) -> list[list[int]]:
    """CTranslate2's beam search (``translate_batch`` with its defaults but beam, length
    penalty and ``max_decoding_length``: patience 1, eos not returned) on our model exported
    to ``workdir``; pad and bos suppressed, as our search forbids them."""
    import ctranslate2

    from aiayn.export.ctranslate2 import export_ctranslate2

    out = export_ctranslate2(model, vocab, workdir / "ct2")
    threads = torch.get_num_threads()
    translator = ctranslate2.Translator(str(out), compute_type="float32", intra_threads=threads)
    pieces = [[vocab.id_to_piece(i) for i in s[:-1]] for s in sources]  # it appends eos
    results = translator.translate_batch(
        [p for p in pieces if p],
        beam_size=BEAM,
        length_penalty=ALPHA,
        max_decoding_length=max_len,
        suppress_sequences=[[vocab.id_to_piece(vocab.pad_id)], [vocab.id_to_piece(vocab.bos_id)]],
        max_batch_size=32,
    )
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


def peer_outputs(
    rules: str, args: argparse.Namespace, model: Any, vocab: Any, sources: list, workdir: Path
) -> list[list[int]] | None:
    """The toolkit's own outputs for ``rules`` (None for the paper's, or fairseq without
    ``--fairseq-python``)."""
    if rules == "hf":
        return hf_outputs(model, sources)
    if rules == "ct2":
        return ct2_outputs(model, vocab, sources, workdir)
    if rules == "fairseq" and args.fairseq_python:
        return fairseq_outputs(args.fairseq_python, args.checkpoint, sources, workdir)
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", default="runs/demo/averaged")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--limit", type=int, help="the first N test verses (default: all)")
    parser.add_argument("--fairseq-python", help="an interpreter with fairseq (module doc)")
    parser.add_argument("--rules", nargs="+", default=list(SEARCH_RULES), choices=SEARCH_RULES)
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument(
        "--outputs", type=Path, help="write our outputs under each rule here, as RULE.hyp.es"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    src_path, ref_path = bundled_corpus_paths()["test"]
    lines, refs = read_lines(src_path)[: args.limit], read_lines(ref_path)[: args.limit]
    model, vocab = load_translator(args.checkpoint)
    decoding = for_decoding(load_translator(args.checkpoint)[0])  # as aiayn evaluate decodes;
    # a copy: it packs the weights in place, and the exporters refuse packed ones
    sources = [vocab.encode_source(line) for line in lines]
    print(f"CPU: {cpu_description()}; torch {torch.__version__}; {args.threads} thread(s)")
    print(f"{args.checkpoint}: {len(lines)} test verses, beam {BEAM}, alpha {ALPHA}", flush=True)
    record: dict[str, Any] = {"cpu": cpu_description(), "threads": args.threads, "rules": {}}
    texts: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.rules:
            start = time.perf_counter()
            mine = ours(decoding, sources, SEARCH_RULES[name])
            seconds = time.perf_counter() - start
            row: dict[str, Any] = {"seconds_ours": seconds}
            texts[name] = [vocab.decode(t) for t in mine]
            if args.outputs:
                write_lines_atomic(args.outputs / f"{name}.hyp.es", texts[name])
            start = time.perf_counter()
            theirs = peer_outputs(name, args, model, vocab, sources, Path(tmp))
            if theirs is not None:
                row["seconds_toolkit"] = time.perf_counter() - start
                row["equal"] = sum(a == b for a, b in zip(mine, theirs))
                row["differ"] = [i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b]
            record["rules"][name] = row
            agreement = f"{row['equal']} / {len(lines)} equal" if "equal" in row else "not run"
            print(f"{name}: ours {seconds:.1f} s; the toolkit's: {agreement}", flush=True)
    report_scores(record, texts, refs)
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1), encoding="utf-8")


def report_scores(record: dict[str, Any], texts: dict[str, list[str]], refs: list[str]) -> None:
    """SacreBLEU with its interval per rule, and p-values against the first (the paper's)."""
    tested = significance(list(texts.items()), refs, ["bleu"])
    for name, scores in zip(tested.names, tested.scores):
        bleu = scores["BLEU"]
        record["rules"][name]["bleu"] = bleu.as_dict()
        p = "" if bleu.p_bootstrap is None else f", p = {bleu.p_bootstrap:.4f} / {bleu.p_ar:.4f}"
        print(f"{name}: BLEU {bleu.score:.2f} ({bleu.mean:.2f} +- {bleu.ci:.2f}){p}")
    record["signature"] = tested.signatures["BLEU"]
    print(tested.signatures["BLEU"])


if __name__ == "__main__":
    sys.exit(main())
