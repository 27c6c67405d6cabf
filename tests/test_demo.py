"""The main job end to end on a budget of a few updates, and the CLI on what it leaves behind.

Every run here stops on a count of updates, so what it trains is the same on any machine; the
wall-clock budget (``--minutes``) is tested with a clock the test moves.
"""

import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import sacrebleu
import torch
from _cli import one_line_error, run_cli
from _pictures import assert_picture

from aiayn import checkpoint as ckpt
from aiayn import demo as demo_module
from aiayn import records
from aiayn.data import Vocab, bundled_corpus_paths
from aiayn.demo import DEMO_UPDATES, demo_train_config, format_report, run_demo
from aiayn.evaluate import reference_perplexity
from aiayn.files import read_lines
from aiayn.runtime.workers import auto_workers, run_batches
from aiayn.train import TrainConfig
from aiayn.train import trainer as trainer_module
from aiayn.train.config import recipe_config

DEMO_WORKERS: list[int] = []  # ``workers`` of each search of the demo fixture's run, in order
UPDATES = 24  # the fixture's budget: a checkpoint every 6 updates, 4 in all


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    root = tmp_path_factory.mktemp("demo")
    sets = [
        "preset=tiny",
        "max_src_tokens=600",
        "max_tgt_tokens=600",
        "save_every_updates=6",
        "valid_bleu_sentences=3",
    ]

    def spy(decode_batch, n, *, workers=1):  # which workers the test split's search was given
        DEMO_WORKERS.append(workers)
        return run_batches(decode_batch, n, workers=workers)

    with pytest.MonkeyPatch.context() as patch:  # a CPU without native bf16, whatever runs it
        patch.setenv("AIAYN_ASSUME_BF16", "emulated")
        patch.setattr(importlib.import_module("aiayn.decode.translate"), "run_batches", spy)
        report = run_demo(
            updates=UPDATES,
            work=root / "work",
            out=root / "run",
            sets=sets,
            test_limit=6,
            progress=lambda message: None,
        )
    return root, report


def test_demo_writes_every_artefact(demo):
    root, report = demo
    run = root / "run"
    # the report and the training summary, as returned
    assert json.loads((run / "report.json").read_text()) == json.loads(json.dumps(report))
    assert json.loads((run / "summary.json").read_text()) == report["training"]
    # the averaged checkpoint: the mean of the checkpoints it names, with the corpus's vocabulary
    model, _ = ckpt.load_transformer(run / "averaged")
    meta = ckpt.read_meta(run / "averaged")
    kept = {p.name: p for p in ckpt.list_checkpoints(run / "checkpoints")}
    assert meta["averaged_from"] and set(meta["averaged_from"]) <= set(kept)
    parts = [
        dict(ckpt.load_transformer(kept[n])[0].named_parameters()) for n in meta["averaged_from"]
    ]
    for name, p in model.named_parameters():
        mean = sum(part[name] for part in parts) / len(parts)
        assert torch.allclose(p, mean, atol=1e-6), name
    vocab = Vocab.load(run / "averaged/spm.model")
    assert vocab.fingerprint == Vocab.load(root / "work/spm.model").fingerprint
    assert vocab.fingerprint == meta["vocab_fingerprint"]
    # the test hypotheses, one a sentence: the report's samples
    hyps = read_lines(run / "test.hyp.es")
    assert len(hyps) == 6 and hyps == [s["hypothesis"] for s in report["samples"]]
    # the log: a validation at each checkpoint, as the checkpoint records it; the last one
    # the summary's
    records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    validations = [r for r in records if "valid_ppl" in r]
    assert len(validations) == len(report["bleu_per_checkpoint"]) >= 2
    for r in validations:
        name = ckpt.checkpoint_name(r["update"])
        if name in kept:  # keep_last may have pruned the first ones
            assert ckpt.read_meta(kept[name])["valid"]["valid_ppl"] == r["valid_ppl"]
    assert validations[-1]["update"] == report["training"]["updates"] >= 1
    assert validations[-1]["valid_ppl"] == report["training"]["valid_ppl"]
    assert report["training"]["updates"] == UPDATES
    # the pictures
    assert_picture(run / "training.png")
    maps = sorted((run / "attention").glob("*.png"))
    assert len(maps) == report["artefacts"]["n_attention_maps"] == 3 * 3 * 2  # 3 sentences,
    for path in maps:  # 3 kinds, 2 layers
        assert_picture(path)


def test_demo_decodes_the_test_split_with_evaluates_default_workers(demo):
    *validation, test_split = DEMO_WORKERS  # training's validation BLEU searches come first
    assert test_split == auto_workers("cpu") and set(validation) == {1}


def test_demo_bleu_is_sacrebleu_of_the_written_hypotheses(demo):
    root, report = demo
    hyps = read_lines(root / "run/test.hyp.es")
    refs = read_lines(bundled_corpus_paths()["test"][1])[:6]
    assert len(hyps) == 6
    assert report["test"]["sacrebleu"] == pytest.approx(
        sacrebleu.corpus_bleu(hyps, [refs]).score, abs=1e-9
    )
    text = format_report(report)
    assert f"SacreBLEU   {report['test']['sacrebleu']:.2f}" in text and "MFU" in text


def test_demo_report_shows_chrf_and_ter_with_intervals_as_evaluate_does(demo):
    root, report = demo
    hyps = read_lines(root / "run/test.hyp.es")
    refs = read_lines(bundled_corpus_paths()["test"][1])[:6]
    test = report["test"]
    # sacrebleu's own scores of the written hypotheses, as aiayn evaluate reports them
    assert test["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score, abs=1e-9)
    assert test["ter"] == pytest.approx(sacrebleu.corpus_ter(hyps, [refs]).score, abs=1e-9)
    lines = format_report(report).splitlines()
    for label, name in (("SacreBLEU", "BLEU"), ("chrF2", "chrF2"), ("TER", "TER")):
        s = test["intervals"][name]
        shown = [line for line in lines if line.startswith(f"  {label} ")]
        assert len(shown) == 1 and f"{s['score']:.2f} ({s['mean']:.2f} ± {s['ci']:.2f})" in shown[0]
        assert name == "BLEU" or test["interval_signatures"][name] in shown[0]
    assert test["intervals"]["BLEU"]["score"] == pytest.approx(test["sacrebleu"], abs=1e-9)


def test_the_demo_report_says_which_precision_trained_and_why(demo):
    _, report = demo
    # the suite's CPU has no native bf16 (conftest): auto is fp32, and compile's figure says why
    assert report["training"]["resolved"]["amp"] == "fp32"
    assert (
        "precision fp32 (amp=auto and the CPU has no native bf16 (AIAYN_ASSUME_BF16=emulated)); "
        "compiled step off (compile=auto: compiled 0.90x eager after 35 s of compiling on "
        "cpu-no_bf16"
    ) in format_report(report)


def test_demo_averages_the_number_of_checkpoints_with_the_best_validation_perplexity(demo):
    root, report = demo
    by_k = {int(k): v for k, v in report["valid_ppl_by_number_averaged"].items()}
    assert sorted(by_k) == list(range(1, len(by_k) + 1)) and len(by_k) >= 2
    chosen = ckpt.read_meta(root / "run/averaged")["averaged_from"]
    assert by_k[len(chosen)] == min(by_k.values()) == report["valid_ppl_averaged"]
    kept = [p.name for p in ckpt.list_checkpoints(root / "run/checkpoints")]
    assert chosen == kept[-len(chosen) :]
    model, _ = ckpt.load_transformer(root / "run/averaged")
    valid_src, valid_ref = (read_lines(p) for p in bundled_corpus_paths()["valid"])
    ppl = reference_perplexity(
        model, Vocab.load(root / "run/averaged/spm.model"), valid_src, valid_ref
    )
    assert ppl == pytest.approx(report["valid_ppl_averaged"], rel=1e-5)
    assert not (root / "run/.averaged.candidates").exists()


def test_demo_rerun_reuses_data_and_training(demo):
    root, report = demo
    vocab = root / "work/spm.model"
    stamp = vocab.stat().st_mtime_ns
    again = run_demo(
        updates=UPDATES,
        work=root / "work",
        out=root / "run",
        sets=["preset=tiny", "max_src_tokens=600", "max_tgt_tokens=600", "valid_bleu_sentences=3"],
        test_limit=6,
        progress=lambda message: None,
    )
    assert vocab.stat().st_mtime_ns == stamp  # the prepared corpus was reused
    assert again["training"]["updates"] == report["training"]["updates"]  # budget already spent
    assert again["test"]["sacrebleu"] == report["test"]["sacrebleu"]


def test_demo_fresh_deletes_a_run_the_demo_made(demo, tmp_path, monkeypatch):
    root, _ = demo
    run = shutil.copytree(root / "run", tmp_path / "run")

    def stop(work):
        raise RuntimeError("stopped after --fresh")

    monkeypatch.setattr(demo_module, "prepare_bundled", stop)
    with pytest.raises(RuntimeError, match="stopped after --fresh"):
        run_demo(out=run, work=root / "work", sets=["preset=tiny"], fresh=True)
    assert not run.exists()


def test_demo_stops_after_its_updates_and_says_that_its_time_is_what_varies(demo):
    _, report = demo
    assert report["train_config"]["max_minutes"] is None
    assert report["training"]["updates"] == report["train_config"]["max_updates"] == UPDATES
    text = format_report(report)
    assert f"Training stopped after {UPDATES} updates, as on every CPU" in text
    assert "the minutes are this machine's" in text


def test_demo_writes_a_record_of_its_run_in_the_run_directory(demo):
    root, report = demo
    path = Path(report["record"])  # a rerun of the demo adds its own record beside it
    assert path.parent == root / "run/records" and path.name.startswith("demo-")
    record = records.check(json.loads(path.read_text(encoding="utf-8")), str(path))
    assert record.topic == "demo" and record.figures["updates"] == UPDATES
    assert record.figures["SacreBLEU"] == round(report["test"]["sacrebleu"], 2)
    assert record.figures["paper BLEU"] == round(report["test"]["paper_bleu"], 2)
    assert record.figures["end to end"] == f"{report['end_to_end_s'] / 60:.1f} min"
    assert record.command.startswith(f"aiayn demo --updates {UPDATES} --set preset=tiny")
    assert record.what == f"`aiayn demo`, {UPDATES} updates, test split of 6 verses"
    assert record.threads == torch.get_num_threads() and record.torch == torch.__version__


def test_the_demo_stops_on_updates_by_default_and_on_the_clock_when_given_minutes(tmp_path):
    by_updates = demo_train_config(tmp_path, tmp_path / "out")
    assert (by_updates.max_updates, by_updates.max_minutes) == (DEMO_UPDATES, None)
    assert (by_updates.save_every_updates, by_updates.save_every_minutes) == (146, None)
    recipe = recipe_config("demo", [])  # `aiayn train demo` stops where `aiayn demo` does
    assert (recipe.max_updates, recipe.save_every_updates) == (DEMO_UPDATES, 146)
    by_clock = demo_train_config(tmp_path, tmp_path / "out", minutes=15)
    assert (by_clock.max_updates, by_clock.max_minutes) == (None, 15)
    assert (by_clock.save_every_updates, by_clock.save_every_minutes) == (None, 1)


def test_a_wall_clock_budget_stops_training_when_the_clock_says_so(tiny_corpus, tmp_path):
    """--minutes: the trainer's clock moves 10 s an update here, so 0.5 minutes is 3 updates on
    any machine."""
    cfg = TrainConfig(
        data=str(tiny_corpus),
        out=str(tmp_path / "run"),
        preset="tiny",
        model={"N_enc": 1, "N_dec": 1, "d_model": 32, "d_ff": 64, "h": 2},
        max_src_tokens=400,
        max_tgt_tokens=400,
        max_updates=None,
        max_minutes=0.5,
        save_every_minutes=None,
        save_every_updates=2,
        validate=False,
        num_threads=1,
        amp="none",
    )
    trainer = trainer_module.Trainer(cfg)
    clock = SimpleNamespace(monotonic=lambda: trainer.update * 10.0)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(trainer_module, "time", clock)
        summary = trainer.run(resume=None)
    assert trainer.stopped == "max_minutes"
    assert summary["updates"] == 3 and summary["elapsed_s"] == 30.0


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], {"minutes": None, "updates": None}),
        (["--minutes", "15"], {"minutes": 15.0, "updates": None}),
        (["--updates", "500", "--record", "recs"], {"minutes": None, "updates": 500}),
    ],
)
def test_demo_cli_passes_its_budget_and_record_directory(capsys, monkeypatch, argv, expected):
    seen = {}

    def fake_run_demo(**kwargs):
        seen.update(kwargs)
        raise RuntimeError("stopped before the demo")

    monkeypatch.setattr(demo_module, "run_demo", fake_run_demo)
    with pytest.raises(RuntimeError, match="stopped before the demo"):
        run_cli(capsys, "demo", *argv)
    assert {k: seen[k] for k in expected} == expected
    assert seen["record"] == (Path("recs") if "--record" in argv else None)


def test_demo_cli_refuses_both_budgets_and_a_budget_below_one(capsys):
    code, _, err = run_cli(capsys, "demo", "--minutes", "15", "--updates", "100")
    assert code == 2 and "not allowed with argument" in err
    code, _, err = run_cli(capsys, "demo", "--updates", "0")
    assert code == 2 and "must be a positive number, not 0" in err


def test_demo_set_lands_even_when_it_equals_the_preset_default(tmp_path):
    cfg = demo_train_config(tmp_path, tmp_path / "out", minutes=15, sets=["model.P_drop=0.1"])
    assert cfg.model_config(None).P_drop == 0.1  # the recipe's 0.0 loses to --set


@pytest.mark.parametrize(("key", "flag"), [("out", "--out"), ("data", "--work")])
def test_demo_refuses_out_and_data_in_set_naming_the_flag(tmp_path, capsys, key, flag):
    elsewhere = tmp_path / "elsewhere"
    code, _, err = run_cli(
        capsys,
        "demo",
        "--out",
        tmp_path / "run",
        "--work",
        tmp_path / "work",
        "--set",
        f"{key}={elsewhere}",
    )
    assert code == 2
    one_line_error(err, f"--set {key}", flag)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing prepared, trained or made


def _translate_stdin(checkpoint, lines: list[str], *options: str) -> list[str]:
    text = "".join(line + "\n" for line in lines)
    argv = [sys.executable, "-m", "aiayn", "translate", "--checkpoint", str(checkpoint)]
    # fp32: a sentence's translation is then the same in any batch, bit for bit
    result = subprocess.run(
        [*argv, "--beam", "2", "--precision", "fp32", *options],
        input=text,
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.endswith("\n")
    return result.stdout.split("\n")[:-1]


def test_translate_cli_keeps_lines_and_order(demo):
    root, _ = demo
    lines = [
        "In the beginning God created the heavens and the earth.",
        "",
        "And God said.",
        "And God saw the light, that it was good: and God divided the light from the darkness.",
        "",
        "Amen.",
    ]
    out = _translate_stdin(root / "run/averaged", lines)
    assert len(out) == len(lines)  # a line out for every line in, blank for blank
    assert out[1] == out[4] == ""  # (the barely trained model may also translate a line as "")
    # each output is its own line's translation: the lines decoded one per batch (the demo's
    # few seconds of training may give two lines the same output; a swap of any others shows)
    alone = _translate_stdin(root / "run/averaged", lines, "--batch-size", "1")
    assert out == alone
    assert len(set(out[i] for i in (0, 2, 3, 5))) > 1  # not one output for every line
    # the lines in another order (sorted by length for batching, as before): each output
    # follows its input
    backwards = _translate_stdin(root / "run/averaged", lines[::-1])
    assert backwards == out[::-1]


def test_evaluate_cli_reports_both_bleus(demo, tmp_path):
    root, _ = demo
    src, ref = tmp_path / "src.en", tmp_path / "ref.es"
    src.write_text("And God said.\nLet there be light.\n")
    ref.write_text("Y dijo Dios.\nSea la luz.\n")
    out = tmp_path / "hyp.es"
    start = time.monotonic()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "aiayn",
            "evaluate",
            "--checkpoint",
            str(root / "run/averaged"),
            "--src",
            str(src),
            "--ref",
            str(ref),
            "--output",
            str(out),
            "--lang",
            "es",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    wall = time.monotonic() - start
    scores = json.loads(result.stdout)
    assert scores["sentences"] == 2 and scores["signature"].startswith("nrefs:1")
    # the search's own time: within the command's, which also starts Python and loads the model
    assert 0 < scores["decode_s"] < wall
    assert 2 / wall < scores["sentences_per_s"] == pytest.approx(2 / scores["decode_s"])
    hyps = read_lines(out)
    assert scores["sacrebleu"] == pytest.approx(
        sacrebleu.corpus_bleu(hyps, [read_lines(ref)]).score
    )


def test_average_cli_chooses_how_many_by_perplexity(tiny_run, tmp_path, capsys):
    # tiny_run's 3 checkpoints (one an update): three of them, whatever the demo keeps
    src, ref = tmp_path / "src.en", tmp_path / "ref.es"
    valid_src, valid_ref = (read_lines(p)[:40] for p in bundled_corpus_paths()["valid"])
    src.write_text("\n".join(valid_src) + "\n")
    ref.write_text("\n".join(valid_ref) + "\n")
    out = tmp_path / "averaged"
    checkpoints = tiny_run / "checkpoints"
    argv = ["average", checkpoints, "--last", 3, "--choose-on", src, ref, "--out", out]
    code, stdout, stderr = run_cli(capsys, *argv)
    assert code == 0, stderr
    line = stdout.splitlines()[0].split(": ", 1)[1]
    ppl = {int(k): float(v) for k, v in (item.split(": ") for item in line.split(", "))}
    assert sorted(ppl) == [1, 2, 3] and len(set(ppl.values())) == 3  # no tie to choose among
    chosen = ckpt.read_meta(out)["averaged_from"]
    assert ppl[len(chosen)] == min(ppl.values())
    assert chosen == [p.name for p in ckpt.list_checkpoints(checkpoints)][-len(chosen) :]


def test_bad_config_key_is_one_clear_line(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("preset: tiny\nlearning_rate: 3\n")
    result = subprocess.run(
        [sys.executable, "-m", "aiayn", "train", str(cfg)], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "unknown key(s) ['learning_rate']" in result.stderr and "Traceback" not in result.stderr


def test_demo_says_the_budget_its_sets_leave(tmp_path):
    """The progress line names what will stop the training, --set max_minutes=null included
    (it said "15 minutes" for a run of fixed updates)."""
    said = []

    def stop(*_args, **_kwargs):
        raise RuntimeError("stopped before training")

    sets = ["max_minutes=null", "max_updates=3346"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(demo_module, "prepare_bundled", lambda work: _fake_meta())
        patch.setattr(demo_module, "_train", stop)
        with pytest.raises(RuntimeError, match="stopped before training"):
            run_demo(out=tmp_path / "run", work=tmp_path / "work", sets=sets, progress=said.append)
    assert "[2/5] training for 3,346 updates" in said
    assert demo_module._budget(demo_train_config(tmp_path, tmp_path, 15)) == "15 minutes"


def _fake_meta() -> dict:
    return {"splits": {"train": {"pairs": 1}}, "vocab_size": 8}


def test_demo_stopped_by_a_signal_while_training_saves_and_says_how_to_continue(
    demo, tmp_path, capsys, monkeypatch
):
    root, _ = demo
    trainer_module = importlib.import_module("aiayn.train.trainer")
    real_update = trainer_module.Trainer.train_update

    def update_then_sigterm(self, batches):
        stats = real_update(self, batches)
        os.kill(os.getpid(), signal.SIGTERM)  # as a scheduler's pre-emption would
        return stats

    monkeypatch.setattr(trainer_module.Trainer, "train_update", update_then_sigterm)
    argv = ["demo", "--work", root / "work", "--out", tmp_path / "run", "--set", "preset=tiny"]
    code, out, err = run_cli(capsys, *argv, "--set", "max_src_tokens=600", "--minutes", 5)
    assert code == 143 and "[2/5] training" in out
    checkpoint = ckpt.latest_checkpoint(tmp_path / "run" / "checkpoints")
    one_line_error(
        err,
        f"aiayn demo: stopped by SIGTERM at update 1, checkpoint {checkpoint}; run the same "
        "command again to continue (the corpus and checkpoints are kept)",
    )
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handlers from before


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_demo_stopped_by_a_signal_outside_training_is_one_line(
    tmp_path, capsys, monkeypatch, signum, code
):
    def signalled(work):
        os.kill(os.getpid(), signum)
        time.sleep(5)  # the handler runs before this ends
        raise AssertionError("the signal did not stop the demo")

    monkeypatch.setattr(demo_module, "prepare_bundled", signalled)
    got, out, err = run_cli(capsys, "demo", "--work", tmp_path / "w", "--out", tmp_path / "run")
    assert got == code and "[2/5]" not in out
    one_line_error(
        err,
        f"aiayn demo: stopped by {signal.Signals(signum).name}; run the same command again to "
        "continue (the corpus and checkpoints are kept)",
    )
