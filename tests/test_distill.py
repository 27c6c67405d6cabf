"""Sequence-level distillation (``aiayn.distill``): the teacher's resumable translation, the
choice among its n-best, the filter, the paired difference, the student presets, and the
whole command end to end on a tiny teacher."""

import json
import math
import re
from pathlib import Path

import pytest
import sacrebleu
from _cli import one_line_error, run_cli

from aiayn import Translator
from aiayn.checkpoint import list_checkpoints
from aiayn.config import ModelConfig
from aiayn.data.binarize import TokenDataset
from aiayn.data.pieces import load_vocabulary
from aiayn.distill import teacher as teacher_module
from aiayn.distill.corpus import Filter, best_by_metric, choose, distil, ppl
from aiayn.distill.pipeline import training_text
from aiayn.distill.teacher import read_nbest, translate_resumable
from aiayn.errors import UserError
from aiayn.metrics.significance import paired_difference
from aiayn.records import load_records
from aiayn.runtime.flops import count_parameters

DOCS = Path(__file__).resolve().parents[1] / "docs" / "distill.md"
SETTINGS = {"teachers": ["t"], "search": {"beam": 2}}


@pytest.fixture(scope="module")
def teacher(tiny_run) -> Path:
    return list_checkpoints(tiny_run / "checkpoints")[-1]


@pytest.fixture(scope="module")
def sources(tiny_corpus) -> list[str]:
    return training_text(tiny_corpus, 10)[0]


def _translate(teacher, sources, out, chunk=4, settings=SETTINGS):
    with Translator(teacher, workers=1) as translator:
        request = translator.request(beam=2, nbest=2)
        return translate_resumable(
            translator, sources, out, request, settings=settings, chunk=chunk
        )


def test_training_text_reads_back_the_pairs_training_saw(tiny_corpus):
    sources, references = training_text(tiny_corpus, 5)
    vocab, train = load_vocabulary(tiny_corpus), TokenDataset(tiny_corpus, "train")
    assert len(sources) == len(references) == 5
    for i, (source, reference) in enumerate(zip(sources, references)):
        assert vocab.encode_source(source)[:-1] == train.src(i).tolist()  # its eos aside
        assert vocab.encode_target(reference) == train.tgt(i).tolist()


def test_a_resumed_translation_equals_an_uninterrupted_one(
    teacher, sources, tmp_path, monkeypatch, one_thread
):
    whole = _translate(teacher, sources, tmp_path / "a" / "teacher.jsonl")
    decoded, write = [], teacher_module._write_part

    def dies_after_one(path, lines):
        if decoded:
            raise KeyboardInterrupt  # as a kill between two chunks
        decoded.append(path.name)
        write(path, lines)

    monkeypatch.setattr(teacher_module, "_write_part", dies_after_one)
    out = tmp_path / "b" / "teacher.jsonl"
    with pytest.raises(KeyboardInterrupt):
        _translate(teacher, sources, out)
    assert not out.exists()
    assert [p.name for p in sorted(out.with_name("teacher.jsonl.parts").glob("part-*"))] == [
        "part-000000.jsonl"
    ]
    again = []
    monkeypatch.setattr(
        teacher_module, "_write_part", lambda p, lines: again.append(p.name) or write(p, lines)
    )
    _translate(teacher, sources, out)
    assert again == ["part-000001.jsonl", "part-000002.jsonl"]  # the first chunk was kept
    assert out.read_bytes() == whole.read_bytes()
    nbest = read_nbest(out)
    assert len(nbest) == len(sources) and all(len(n) == 2 for n in nbest)


def test_a_resume_with_other_settings_is_refused(teacher, sources, tmp_path, one_thread):
    out = tmp_path / "teacher.jsonl"
    _translate(teacher, sources[:2], out)
    with pytest.raises(UserError, match=r"other settings \(chunk\)"):
        _translate(teacher, sources[:2], out, chunk=3)
    with pytest.raises(UserError, match=r"other settings \(lines, sources_sha256\)"):
        _translate(teacher, sources[:3], out)


def test_the_metric_picks_the_candidate_closest_to_the_reference():
    reference = "and God saw the light, that it was good"
    candidates = ["and the darkness", "and God saw the light, that it was good", "God saw light"]
    assert best_by_metric(candidates, reference, "chrf") == 1
    assert best_by_metric(candidates, reference, "bleu") == 1
    chrf = [sacrebleu.sentence_chrf(c, [reference]).score for c in candidates[::2]]
    assert best_by_metric(candidates[::2], reference, "chrf") == chrf.index(max(chrf))
    assert best_by_metric(["same", "same"], "same", "chrf") == 0  # a tie: the teacher's order
    nbest = [{"text": c, "log_prob": -1.0, "length": 2} for c in candidates]
    assert choose(nbest, reference, "model") is nbest[0]
    assert choose(nbest, reference, "chrf") is nbest[1]
    assert choose([], reference, "chrf") is None


def _hyp(text, log_prob=-2.0, length=4, cut=False):
    found = {"text": text, "score": log_prob, "log_prob": log_prob, "length": length}
    return {**found, "cut": True} if cut else found


def test_the_filter_drops_empty_cut_unlikely_and_the_worst_share():
    nbest = [
        [_hyp("a good one", -2.0)],
        [],  # a blank source
        [_hyp("  ")],
        [_hyp("on and on", cut=True)],
        [_hyp("unlikely", -40.0, 4)],  # ppl e^10
        [_hyp("fair", -4.0, 4)],
        [_hyp("best", -0.4, 4)],
    ]
    sources = [f"s{i}" for i in range(len(nbest))]
    pairs, counts = distil(sources, sources, nbest, keep=Filter(max_ppl=100.0, drop_worst=0.34))
    assert pairs == [("s0", "a good one"), ("s6", "best")]  # "fair" was the least likely third
    assert counts == {
        "read": 7,
        "empty": 2,
        "cut": 1,
        "max_ppl": 1,
        "drop_worst": 1,
        "kept": 2,
    }
    pairs, counts = distil(sources, sources, nbest)
    assert [s for s, _ in pairs] == ["s0", "s4", "s5", "s6"] and counts["kept"] == 4
    with pytest.raises(UserError, match="drop-worst"):
        Filter(drop_worst=1.0)
    with pytest.raises(UserError, match="does not match"):
        distil(sources, sources[:2], nbest)


@pytest.mark.slow
def test_the_filter_reads_the_teachers_own_score(teacher, sources, one_thread):
    """The log-probability the filter reads is what forced decoding (``aiayn score``) gives
    the same output pieces: the search already computed it."""
    from aiayn.decode import score_ids

    with Translator(teacher, workers=1) as translator:
        request, vocab = translator.request(beam=2, nbest=2), translator.vocab
        outputs = [o for window in translator.windows(sources, request) for o in window]
        for source, hyps in zip(sources, outputs):
            for hyp in hyps:
                end = [] if hyp.cut else [vocab.eos_id]
                forced = score_ids(
                    translator.model, [vocab.encode_source(source)], [hyp.ids + end], alpha=0.6
                )[0]
                assert forced.length == hyp.length
                assert math.isclose(hyp.log_prob, forced.log_prob, rel_tol=1e-4, abs_tol=1e-3)
                assert math.isclose(ppl(hyp.record()), forced.ppl, rel_tol=1e-4)


def test_the_paired_difference_is_the_difference_with_its_interval():
    references = [f"the light was good number {i}" for i in range(40)]
    base = [r if i % 2 else "the dark" for i, r in enumerate(references)]
    better = [r if i % 4 else "the dark" for i, r in enumerate(references)]
    diff = paired_difference(base, better, references)
    scores = [sacrebleu.corpus_bleu(h, [references]).score for h in (base, better)]
    assert math.isclose(diff.score, scores[1] - scores[0])
    assert diff.mean - diff.ci > 0  # better on every resample's lines it differs on
    same = paired_difference(base, base, references, "chrf")
    assert (same.score, same.mean, same.ci) == (0.0, 0.0, 0.0)


def test_the_docs_give_each_student_preset_its_computed_parameter_count():
    page = DOCS.read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(student-[\w-]+)` \|.*\| ([\d.]+)M \|$", page, re.MULTILINE)
    assert {name for name, _ in rows} == {"student-base", "student-tiny", "student-demo"}
    for name, millions in rows:
        assert f"{count_parameters(ModelConfig.preset(name)) / 1e6:.1f}" == millions, name


@pytest.mark.slow
def test_distill_end_to_end_writes_a_student_a_report_and_records(
    teacher, tiny_corpus, tmp_path, capsys, one_thread
):
    out = tmp_path / "run"
    argv = [
        "distill",
        str(teacher),
        "--data",
        str(tiny_corpus),
        "--out",
        str(out),
        "--student",
        "tiny",
        "--student-updates",
        "2",
        "--teacher-limit",
        "12",
        "--test-limit",
        "4",
        "--speed-limit",
        "2",
        "--nbest",
        "2",
        "--select",
        "chrf",
        "--workers",
        "1",
        "--quiet",
        "--set",
        "max_src_tokens=400",
        "--set",
        "max_tgt_tokens=400",
        "--set",
        "valid_bleu_sentences=2",
        "--set",
        "model.N_enc=1",
        "--set",
        "model.N_dec=1",
    ]
    code, stdout, _ = run_cli(capsys, *argv)
    assert code == 0, stdout
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert report["training"]["updates"] == 2
    assert report["distilled"]["read"] == 12
    assert report["distilled"]["kept"] == len((out / "distilled.src").read_text().splitlines())
    assert report["test"]["teacher"]["sentences"] == report["test"]["student"]["sentences"] == 4
    for side in ("teacher", "student"):
        hyps = (out / f"test.{side}.hyp").read_text(encoding="utf-8").splitlines()
        assert len(hyps) == 4
        assert report["test"][side]["sacrebleu"] >= 0 and report["sizes"][side]["bytes"] > 0
    assert report["speed_up"] > 0
    forms = {(t["model"], t["form"], t["threads"]) for t in report["speed"]}
    assert len(forms) == 16 and all(t["sentences"] == 2 for t in report["speed"])
    assert 0 <= report["paired"]["BLEU"]["p_bootstrap"] <= 1
    diff = report["difference"]["bleu"]
    bleus = [report["test"][s]["sacrebleu"] for s in ("teacher", "student")]
    assert math.isclose(diff["score"], bleus[1] - bleus[0], abs_tol=1e-9)
    records = load_records(out / "records")
    assert len(records) == 9 and {r.topic for r in records} == {"distill"}
    summary = next(r for r in records if "test split" in r.what)
    assert summary.figures["student updates"] == 2
    assert summary.command.startswith("aiayn distill ") and "--select chrf" in summary.command
    assert "speed-up" in stdout
    # a second run continues: the teacher's file and the data are reused, the student's
    # training is at its end, and the record set grows
    teacher_file = (out / "teacher.jsonl").stat().st_mtime_ns
    code, _, _ = run_cli(capsys, *argv, "--test-limit", "2", "--speed-limit", "1")  # the last wins
    assert code == 0 and len(load_records(out / "records")) == 18
    assert (out / "teacher.jsonl").stat().st_mtime_ns == teacher_file
    again = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert again["training"]["updates"] == 2 and again["test"]["student"]["sentences"] == 2


def test_distill_refuses_an_out_it_did_not_make(teacher, tiny_corpus, tmp_path, capsys):
    (tmp_path / "mine.txt").write_text("keep me\n")
    code, _, err = run_cli(
        capsys, "distill", str(teacher), "--data", str(tiny_corpus), "--out", str(tmp_path)
    )
    assert code == 2
    one_line_error(err, "did not make it")
    code, _, err = run_cli(
        capsys,
        "distill",
        str(teacher),
        "--data",
        str(tiny_corpus),
        "--out",
        str(tmp_path / "new"),
        "--select",
        "chrf",
    )
    assert code == 2
    one_line_error(err, "--nbest 2")
