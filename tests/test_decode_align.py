"""Word alignments (``aiayn.decode.align``): the subword merge and the Pharaoh format on hand
alignments with a scripted attention matrix, and ``translate --alignments`` on a real model."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from _cli import one_line_error, run_cli

from aiayn.checkpoint import latest_checkpoint
from aiayn.data import Vocab
from aiayn.decode.align import alignment_error_rate, format_pharaoh, pharaoh, word_index

FIXTURE = Path(__file__).with_name("fixtures") / "alignments"
PAIRS = re.compile(r"^(\d+-\d+( \d+-\d+)*)?$")


def fixture() -> list[tuple[str, str, list[tuple[int, int]]]]:
    en, es, gold = (
        (FIXTURE / n).read_text(encoding="utf-8").splitlines()
        for n in ("en.txt", "es.txt", "gold.txt")
    )
    links = [[tuple(map(int, p.split("-"))) for p in line.split()] for line in gold]
    return list(zip(en, es, links))


def test_word_index_starts_a_word_at_each_boundary_piece():
    assert word_index(["▁In", "▁the", "▁begin", "ning", "▁", ",", "▁God"]) == [0, 1, 2, 2, 3, 3, 4]
    assert word_index(["no", "mark", "▁here"]) == [0, 0, 1]
    assert format_pharaoh([(0, 0), (2, 1), (1, 2)]) == "0-0 2-1 1-2"


def scripted_attention(
    src_words: list[int], tgt_words: list[int], gold: dict[int, int]
) -> torch.Tensor:
    """(T, S + 1 for eos): for each target subword of word j, mass on the subwords of its gold
    source word g and on the first subword of a decoy word; the first subword of a target word
    of several leans to the decoy. Only summing over both words' subwords finds g every time."""
    S, n_src = len(src_words) + 1, max(src_words) + 1
    rows = []
    for t, j in enumerate(tgt_words):
        g = gold[j]
        decoy = (g + 1) % n_src
        lean = len([w for w in tgt_words if w == j]) > 1 and (t == 0 or tgt_words[t - 1] != j)
        on_gold, on_decoy = (0.3, 0.5) if lean else (0.6, 0.2)
        row = torch.full((S,), (1 - on_gold - on_decoy) / S)
        g_cols = [s for s, w in enumerate(src_words) if w == g]
        row[g_cols] += on_gold / len(g_cols)
        row[src_words.index(decoy)] += on_decoy
        rows.append(row)
    return torch.stack(rows)


def test_pharaoh_merges_subwords_on_the_hand_alignments(tiny_corpus):
    vocab = Vocab.load(tiny_corpus / "spm.model")
    per_piece_wrong = 0
    for en, es, gold in fixture():
        src_pieces = [vocab.id_to_piece(i) for i in vocab.encode(en)]
        tgt_pieces = [vocab.id_to_piece(i) for i in vocab.encode(es)]
        src_words, tgt_words = word_index(src_pieces), word_index(tgt_pieces)
        assert max(src_words) + 1 == len(en.split()) and max(tgt_words) + 1 == len(es.split())
        attn = scripted_attention(src_words, tgt_words, {j: i for i, j in gold})
        assert pharaoh(attn, src_pieces, tgt_pieces) == gold, (en, es)
        per_piece = {(src_words[int(attn[t, :-1].argmax())], j) for t, j in enumerate(tgt_words)}
        per_piece_wrong += per_piece != set(gold)
    assert per_piece_wrong >= 10  # the fixture exercises the merge: argmax per subword fails


def test_alignment_error_rate():
    gold = [[(0, 0), (1, 1)], [(0, 0)]]
    assert alignment_error_rate(gold, gold) == 0.0
    # 2 of 3 predicted links right, 3 gold links: 1 - 2 * 2 / 6
    assert alignment_error_rate([[(0, 0), (0, 1)], [(0, 0)]], gold) == pytest.approx(1 / 3)


# --- aiayn translate --alignments ----------------------------------------------------------------


def test_translate_alignments_are_well_formed_and_within_bounds(tiny_run, capsys):
    ckpt = latest_checkpoint(tiny_run / "checkpoints")
    argv = ["translate", "--checkpoint", ckpt, "--input", FIXTURE / "en.txt", "--beam", 2]
    code, out, err = run_cli(capsys, *argv, "--alignments", "--nbest", 2, "--token-scores")
    assert code == 0, err
    sources = (FIXTURE / "en.txt").read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in out.splitlines()]
    assert len(records) == len(sources) == 30
    for record, source in zip(records, sources):
        n_src = len(source.split())
        for hyp in record["hypotheses"]:
            pieces = [p for p, _ in hyp["tokens"] if p != "</s>"]  # the output, eos left out
            n_tgt = max(word_index(pieces), default=-1) + 1
            assert PAIRS.match(hyp["alignment"]), hyp["alignment"]
            links = [tuple(map(int, p.split("-"))) for p in hyp["alignment"].split()]
            assert [j for _, j in links] == list(range(n_tgt))  # each target word once, in order
            assert all(0 <= i < n_src for i, _ in links)
    code, plain, err = run_cli(capsys, *argv, "--alignments", "--alignment-layer", 0)
    assert code == 0, err
    assert all(
        " ||| " in line and PAIRS.match(line.rsplit(" ||| ", 1)[1]) for line in plain.splitlines()
    )


def test_translate_refuses_a_layer_the_model_lacks(tiny_run, tmp_path, capsys):
    ckpt = latest_checkpoint(tiny_run / "checkpoints")
    src = tmp_path / "in.txt"
    src.write_text("In the beginning\n", encoding="utf-8")
    code, _, err = run_cli(
        capsys, "translate", "--checkpoint", ckpt, "--input", src, "--alignments",
        "--alignment-layer", 3,
    )  # fmt: skip
    assert code == 2
    one_line_error(err, "--alignment-layer 3", "1 decoder layer")


def test_an_ensemble_aligns_with_its_models_mean_attention():
    from _decode_helpers import tiny_model

    from aiayn.decode import Ensemble
    from aiayn.decode.align import cross_attention

    a, b = tiny_model(seed=0), tiny_model(seed=1)
    source, output = [5, 6, 7, 3], [8, 9, 10]
    alone = [cross_attention(m, source, output) for m in (a, b)]
    assert alone[0].shape == (3, 4)
    assert torch.allclose(alone[0].sum(-1), torch.ones(3))  # rows are distributions
    both = cross_attention(Ensemble([a, b]), source, output)
    assert torch.allclose(both, (alone[0] + alone[1]) / 2)
    assert not torch.allclose(alone[0], alone[1])


def test_translate_refuses_an_alignment_layer_without_alignments(tiny_run, tmp_path, capsys):
    # it used to be ignored in silence: plain lines, no alignments, exit 0
    ckpt = latest_checkpoint(tiny_run / "checkpoints")
    src = tmp_path / "in.txt"
    src.write_text("In the beginning\n", encoding="utf-8")
    code, out, err = run_cli(
        capsys, "translate", "--checkpoint", ckpt, "--input", src, "--alignment-layer", 0
    )
    assert code == 2 and out == ""
    one_line_error(err, "--alignment-layer", "give --alignments too")
