"""N-best lists (``aiayn.decode.nbest``) and ``aiayn translate --nbest/--format/--token-scores``."""

from __future__ import annotations

import json
import math

import pytest
from _cli import one_line_error, run_cli
from _decode_helpers import B_, EOS, TABLE, A, ScriptedModel

from aiayn.checkpoint import latest_checkpoint
from aiayn.decode import (
    DecodeConfig,
    Output,
    SearchRequest,
    beam_search,
    jsonl_line,
    nbest_outputs,
)


class ScriptedTokenizer:
    """Sources: any non-blank text reads as ids 7 8 9 eos; outputs spell a/b."""

    eos_id = EOS

    def encode_source(self, text: str) -> list[int]:
        return [7, 8, 9, EOS] if text.strip() else []

    def decode(self, ids: list[int]) -> str:
        return " ".join({A: "a", B_: "b"}[i] for i in ids)

    def id_to_piece(self, i: int) -> str:
        return {A: "▁a", B_: "▁b", EOS: "</s>"}[i]


CONFIG = DecodeConfig(beam=2, alpha=2.0, max_len_a=0, max_len_b=3, nbest=2)


def test_nbest_outputs_carry_the_search_scores_and_token_log_probs():
    # test_decode.test_scripted_alpha2_prefers_longer: "b a" (log .36), then "a" (log .42).
    lists = nbest_outputs(
        ScriptedModel(TABLE),
        ["x", "", "y"],
        ScriptedTokenizer(),
        SearchRequest(CONFIG),
        token_scores=True,
    )
    assert lists[1] == []
    hyps = beam_search(ScriptedModel(TABLE), _src(), CONFIG)[0]
    for outputs in (lists[0], lists[2]):
        assert [o.text for o in outputs] == ["b a", "a"]
        assert [o.score for o in outputs] == pytest.approx([h.score for h in hyps], abs=1e-6)
        assert [o.log_prob for o in outputs] == pytest.approx([h.log_prob for h in hyps], abs=1e-6)
        assert [o.length for o in outputs] == [3, 2]
        first, second = outputs
        assert [p for p, _ in first.tokens] == ["▁b", "▁a", "</s>"]
        assert [lp for _, lp in first.tokens] == pytest.approx([math.log(0.4), math.log(0.9), 0])
        assert [lp for _, lp in second.tokens] == pytest.approx([math.log(0.6), math.log(0.7)])
        for o in outputs:
            assert math.fsum(lp for _, lp in o.tokens) == pytest.approx(o.log_prob, abs=1e-6)


def _src():
    import torch

    return torch.tensor([[7, 8, 9, EOS]])


def test_moses_and_jsonl_formats():
    out = Output("b a", -0.5, -1.25, 3, [("▁b", -1.0), ("▁a", -0.25), ("</s>", 0.0)])
    assert out.moses(7) == "7 ||| b a ||| -0.500000 ||| -1.250000"
    assert json.loads(jsonl_line(7, [out])) == {
        "id": 7,
        "hypotheses": [
            {
                "text": "b a",
                "score": -0.5,
                "log_prob": -1.25,
                "length": 3,
                "tokens": [["▁b", -1.0], ["▁a", -0.25], ["</s>", 0.0]],
            }
        ],
    }
    assert json.loads(jsonl_line(0, [])) == {"id": 0, "hypotheses": []}


# --- aiayn translate -------------------------------------------------------------------------------


@pytest.fixture
def inputs(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("In the beginning God created\n\nAnd the earth was\nlight\n", encoding="utf-8")
    return path


def test_translate_nbest_lines(tiny_run, inputs, capsys):
    ckpt = latest_checkpoint(tiny_run / "checkpoints")
    code, out, err = run_cli(
        capsys, "translate", "--checkpoint", ckpt, "--input", inputs, "--nbest", 3
    )
    assert code == 0, err
    fields = [line.split(" ||| ") for line in out.splitlines()]
    assert all(len(f) == 4 for f in fields)
    assert [int(f[0]) for f in fields] == [0, 0, 0, 2, 2, 2, 3, 3, 3]  # line 1 is empty
    for i in (0, 3, 6):
        scores = [float(f[2]) for f in fields[i : i + 3]]
        assert scores == sorted(scores, reverse=True)
    # the first of each list is the plain translation with the same beam (4: raised to K >= 3)
    code, plain, _ = run_cli(capsys, "translate", "--checkpoint", ckpt, "--input", inputs)
    assert [fields[i][1] for i in (0, 3, 6)] == [plain.splitlines()[i] for i in (0, 2, 3)]


def test_translate_jsonl_token_scores(tiny_run, inputs, capsys):
    ckpt = latest_checkpoint(tiny_run / "checkpoints")
    argv = ["translate", "--checkpoint", ckpt, "--input", inputs, "--beam", 2, "--window", 2]
    code, out, err = run_cli(capsys, *argv, "--nbest", 2, "--token-scores")
    assert code == 0, err
    records = [json.loads(line) for line in out.splitlines()]
    assert [r["id"] for r in records] == [0, 1, 2, 3]  # ids run on across chunks
    assert records[1]["hypotheses"] == []
    for record in (records[0], records[2], records[3]):
        assert len(record["hypotheses"]) == 2
        for hyp in record["hypotheses"]:
            assert len(hyp["tokens"]) == hyp["length"]
            assert math.fsum(lp for _, lp in hyp["tokens"]) == pytest.approx(
                hyp["log_prob"], abs=1e-4
            )
    code, out1, _ = run_cli(capsys, *argv, "--format", "jsonl")
    assert [len(json.loads(line)["hypotheses"]) for line in out1.splitlines()] == [1, 0, 1, 1]


def test_translate_refuses_token_scores_as_text(tiny_run, inputs, capsys):
    ckpt = latest_checkpoint(tiny_run / "checkpoints")
    code, _, err = run_cli(
        capsys, "translate", "--checkpoint", ckpt, "--input", inputs, "--token-scores",
        "--format", "text",
    )  # fmt: skip
    assert code == 2
    one_line_error(err, "--token-scores", "--format text")


def test_translate_nbest_raises_the_beam_unless_given(tiny_run, inputs, capsys):
    ckpt = latest_checkpoint(tiny_run / "checkpoints")
    argv = ["translate", "--checkpoint", ckpt, "--input", inputs, "--nbest", 6]
    code, out, err = run_cli(capsys, *argv)
    assert code == 0, err
    assert [line.split(" ||| ")[0] for line in out.splitlines()].count("3") == 6
    code, _, err = run_cli(capsys, *argv, "--beam", 2)
    assert code == 2
    one_line_error(err, "nbest must be in [1, beam=2], got 6")
