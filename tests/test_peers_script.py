"""benchmarks/demo_vs_fairseq.py without fairseq, run as a user runs it: the recipe as fairseq
flags and the dictionary that keeps our ids (``--dry-run``), and its one-line errors."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "demo_vs_fairseq.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)


def dry_run(*args: str) -> dict:
    done = run("--dry-run", *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def one_line_error(done: subprocess.CompletedProcess, message: str) -> None:
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("demo_vs_fairseq: error: "), done.stderr
    assert message in done.stderr and done.stderr.count("\n") == 1, done.stderr


def _flags(args: list[str]) -> dict[str, str | bool]:
    """``--key value`` / ``--switch`` pairs of an argument list (the positional data dir dropped)."""
    flags: dict[str, str | bool] = {}
    for i, arg in enumerate(args):
        if arg.startswith("--"):
            nxt = args[i + 1] if i + 1 < len(args) else "--"
            flags[arg] = True if nxt.startswith("--") else nxt
    return flags


def test_dictionary_keeps_every_piece_at_our_id(tmp_path):
    ours = ["<pad>", "<unk>", "<s>", "</s>", "▁the", "s", "“", "▁Yahweh"]
    (tmp_path / "pieces").write_text("\n".join(ours) + "\n", encoding="utf-8")
    lines = dry_run("1", "--pieces", str(tmp_path / "pieces"))["dictionary"]
    # fairseq numbers <s>, <pad>, </s>, <unk> 0-3 and then the file's entries in order
    fairseq_ids = {line.rsplit(" ", 1)[0]: 4 + k for k, line in enumerate(lines)}
    assert fairseq_ids == {"▁the": 4, "s": 5, "“": 6, "▁Yahweh": 7}
    assert all(line.endswith(" 1") for line in lines)


@pytest.mark.parametrize("bad", ["a b", "<pad>"])
def test_dictionary_refuses_a_piece_fairseq_cannot_hold(bad, tmp_path):
    pieces = ["<pad>", "<unk>", "<s>", "</s>", "▁x", bad]
    (tmp_path / "pieces").write_text("\n".join(pieces) + "\n", encoding="utf-8")
    one_line_error(run("--dry-run", "1", "--pieces", str(tmp_path / "pieces")), "piece 5")


def test_dictionary_of_a_real_vocabulary_has_one_line_per_piece(tiny_corpus, tmp_path):
    from aiayn.data import Vocab

    vocab = Vocab.load(tiny_corpus / "spm.model")
    pieces = [vocab.sp.id_to_piece(i) for i in range(len(vocab))]
    (tmp_path / "pieces").write_text("\n".join(pieces) + "\n", encoding="utf-8")
    lines = dry_run("1", "--pieces", str(tmp_path / "pieces"))["dictionary"]
    assert len(lines) == len(vocab) - 4
    assert len({line.rsplit(" ", 1)[0] for line in lines}) == len(lines)


def test_train_flags_are_the_demo_recipe():
    # ours made 2,864 updates in 15 minutes, a checkpoint a minute: fairseq saves every 191
    flags = _flags(dry_run("2864", "--minutes", "15")["train"])
    assert float(flags["--lr"]) == pytest.approx(0.5 * 256**-0.5 * 300**-0.5)  # 1.804e-3
    assert float(flags["--lr"]) == pytest.approx(1.8042e-3, abs=1e-7)
    expected = {
        "--encoder-layers": "3",
        "--decoder-layers": "3",
        "--encoder-embed-dim": "256",
        "--encoder-ffn-embed-dim": "1024",
        "--decoder-attention-heads": "4",
        "--dropout": "0.0",
        "--label-smoothing": "0.1",
        "--adam-betas": "(0.9, 0.98)",
        "--adam-eps": "1e-09",
        "--warmup-updates": "300",
        "--warmup-init-lr": "0",
        "--lr-scheduler": "inverse_sqrt",
        "--max-tokens": "1024",
        "--required-batch-size-multiple": "1",
        "--seed": "1",
        "--save-interval-updates": "191",
        "--keep-interval-updates": "3",
        "--num-workers": "0",
    }
    assert {k: flags[k] for k in expected} == expected
    assert float(flags["--stop-time-hours"]) == pytest.approx(0.25)
    assert flags["--share-all-embeddings"] is True and flags["--disable-validation"] is True
    assert _flags(dry_run("3")["train"])["--save-interval-updates"] == "1"  # never 0


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.norm=pre", "the fairseq side covers post-LN"),
        ("max_tgt_tokens=2048", "max_src_tokens and max_tgt_tokens must be equal"),
    ],
)
def test_train_flags_refuse_what_fairseq_would_train_differently(override, message):
    one_line_error(run("--dry-run", "1", "--set", override), message)


def test_generate_flags_beam_and_length():
    flags = _flags(dry_run("1")["generate"])
    assert (flags["--beam"], flags["--lenpen"], flags["--max-len-a"], flags["--max-len-b"]) == (
        "4",
        "0.6",
        "1",
        "50",
    )
    assert flags["--path"] == "WORK/checkpoints/average.pt" and flags["--gen-subset"] == "test"
    assert flags["--required-batch-size-multiple"] == "1"


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--out", "{mine}"], "{mine} exists and was not written by this script"),
        (["--out", "{new}", "--minutes", "0"], "--minutes must be a positive number"),
        (["--out", "{new}"], "--fairseq-python {python}: cannot run it"),
        # an --out it wrote may be replaced: the next check is the interpreter's
        (["--out", "{written}"], "--fairseq-python {python}: cannot run it"),
    ],
)
def test_command_line_errors_are_one_line_and_touch_nothing(tmp_path, extra, message):
    names = {key: tmp_path / key for key in ("mine", "new", "written")}
    names["python"] = tmp_path / "no-python"
    names["mine"].mkdir()
    (names["mine"] / "notes.txt").write_text("keep me")
    names["written"].mkdir()
    (names["written"] / "results.json").write_text('{"benchmark": "demo_vs_fairseq"}')
    done = run("--fairseq-python", str(names["python"]), *[a.format(**names) for a in extra])
    one_line_error(done, "error: " + message.format(**names))
    assert (names["mine"] / "notes.txt").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine", "written"]
