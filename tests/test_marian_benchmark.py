"""benchmarks/demo_vs_marian.py without Marian, run as a user runs it: the demo recipe as Marian's
flags (``--dry-run``), Marian's log read into target tokens and seconds (``--log``), the training
pairs exported as the pieces of our ids (``--export``), and its one-line errors."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "demo_vs_marian.py"

# lines of a real Marian log (pymarian 1.12.42, 1 CPU thread, --disp-freq 1u), training one epoch
# of 158 pairs whose targets hold 5,568 pieces: 5,726 labels with one EOS a pair
MARIAN_LOG = """\
[2026-12-07 17:02:30] [marian] Marian v1.12.42 b7be0e964 2025-05-24 22:34:42 -0700
[2026-12-07 17:02:30] [training] Batches are processed as 1 process(es) x 1 devices/process
[2026-12-07 17:02:36] Allocating memory for Adam-specific shards
[2026-12-07 17:02:36] Ep. 1 : Up. 1 : Sen. 24 : Cost 6.22258711 : Time 5.35s : 193.28 words/s : gNorm 5.1334
[2026-12-07 17:02:39] Ep. 1 : Up. 2 : Sen. 48 : Cost 6.27719259 : Time 3.65s : 306.55 words/s : gNorm 5.1310
[2026-12-07 17:02:43] Ep. 1 : Up. 3 : Sen. 76 : Cost 6.24390841 : Time 3.48s : 318.23 words/s : gNorm 5.1114
[2026-12-07 17:02:44] Ep. 1 : Up. 4 : Sen. 90 : Cost 6.29233789 : Time 0.93s : 344.69 words/s : gNorm 5.3991
[2026-12-07 17:02:47] Ep. 1 : Up. 5 : Sen. 122 : Cost 6.15867472 : Time 3.74s : 296.04 words/s : gNorm 5.2975
[2026-12-07 17:02:51] Ep. 1 : Up. 6 : Sen. 158 : Cost 6.08834028 : Time 3.51s : 294.60 words/s : gNorm 5.1110
[2026-12-07 17:02:51] Seen 158 samples
[2026-12-07 17:02:51] Training finished
"""


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)


def dry_run(*args: str) -> dict:
    done = run("--dry-run", *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def flag(args: list[str], name: str, n: int = 1) -> list[str] | str:
    """The ``n`` words after ``name`` in an argument list (one: the word itself)."""
    i = args.index(name)
    return args[i + 1] if n == 1 else args[i + 1 : i + 1 + n]


def test_train_flags_are_the_demo_recipe():
    train = dry_run("--updates", "30", "--threads", "2")["train"]
    shape = {"--type": "transformer", "--enc-depth": "3", "--dec-depth": "3", "--dim-emb": "256"}
    shape |= {"--transformer-heads": "4", "--transformer-dim-ffn": "1024"}
    shape |= {"--transformer-ffn-activation": "relu", "--transformer-preprocess": ""}
    shape |= {"--transformer-postprocess": "dan", "--transformer-dropout": "0.0"}
    recipe = {"--label-smoothing": "0.1", "--cost-type": "ce-mean-words", "--clip-norm": "0"}
    recipe |= {"--lr-warmup": "300", "--lr-decay-inv-sqrt": "300", "--mini-batch-words": "1024"}
    recipe |= {"--seed": "1", "--cpu-threads": "2", "--optimizer-delay": "1"}
    assert {k: flag(train, k) for k in shape | recipe} == shape | recipe
    assert flag(train, "--optimizer-params", 3) == ["0.9", "0.98", "1e-09"]
    # the peak of our schedule: lr_scale 0.5 * 256^-0.5 * 300^-0.5
    assert float(flag(train, "--learn-rate")) == pytest.approx(0.5 * 256**-0.5 * 300**-0.5)
    for switch in ("--tied-embeddings-all", "--output-omit-bias", "--sync-sgd", "--no-spm-encode"):
        assert switch in train
    assert flag(train, "--vocabs", 2) == ["WORK/vocab.spm", "WORK/vocab.spm"]


def test_a_recipe_variant_reaches_marian():
    sets = ["--set", "model.P_drop=0.1", "--set", "warmup=1200", "--set", "max_tgt_tokens=2048"]
    train = dry_run("--updates", "30", *sets)["train"]
    assert flag(train, "--transformer-dropout") == "0.1"
    assert flag(train, "--lr-warmup") == flag(train, "--lr-decay-inv-sqrt") == "1200"
    assert float(flag(train, "--learn-rate")) == pytest.approx(0.5 * 256**-0.5 * 1200**-0.5)
    assert flag(train, "--mini-batch-words") == "2048"


@pytest.mark.parametrize(
    "override, message",
    [("model.norm=pre", "post-LN"), ("model.positional=learned", "sinusoidal")],
)
def test_train_flags_refuse_what_marian_would_train_differently(override, message):
    done = run("--dry-run", "--updates", "30", "--set", override)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("demo_vs_marian: error: ") and message in done.stderr
    assert done.stderr.count("\n") == 1, done.stderr


def test_decode_flags_are_beam_4_with_marians_normalisation():
    decode = dry_run("--updates", "30")["decode"]
    assert decode[0] == "decode" and flag(decode, "--beam-size") == "4"
    assert flag(decode, "--normalize") == "0.6" and "--no-spm-encode" in decode


def test_log_gives_target_labels_with_eos_and_training_seconds(tmp_path):
    (tmp_path / "train.log").write_text(MARIAN_LOG, encoding="utf-8")
    log = dry_run("--updates", "30", "--log", str(tmp_path / "train.log"))["log"]
    assert log["updates"] == 6 and log["train_s"] == pytest.approx(20.66)
    # words/s x Time, rounded in the log to 0.01: the 5,568 pieces plus 158 EOS, within 0.1%
    assert log["target_tokens"] == pytest.approx(5568 + 158, rel=1e-3)


def test_a_log_without_an_update_is_a_one_line_error(tmp_path):
    (tmp_path / "train.log").write_text(MARIAN_LOG.splitlines()[0] + "\n", encoding="utf-8")
    done = run("--dry-run", "--updates", "3", "--log", str(tmp_path / "train.log"))
    assert done.returncode == 2 and "holds no display line" in done.stderr


def test_export_writes_the_pairs_our_trainer_sees_as_pieces_of_the_same_ids(tiny_corpus, tmp_path):
    import sentencepiece as spm

    from aiayn.data import TokenDataset

    done = run("--export", str(tiny_corpus), "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    # Marian reads the pieces with --no-spm-encode and looks each up in vocab.spm: our model
    assert (tmp_path / "vocab.spm").read_bytes() == (tiny_corpus / "spm.model").read_bytes()
    marian_vocab = spm.SentencePieceProcessor(model_file=str(tmp_path / "vocab.spm"))
    data = TokenDataset(tiny_corpus, "train")
    for name, get in (("train.en", data.src), ("train.es", data.tgt)):
        lines = (tmp_path / name).read_text(encoding="utf-8").splitlines()
        assert len(lines) == len(data)
        ids = [[marian_vocab.piece_to_id(p) for p in line.split(" ")] for line in lines]
        assert ids == [get(i).tolist() for i in range(len(data))]


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "give --updates N"),
        (["--updates", "0"], "--updates must be at least 1"),
        (["--updates", "5"], "--marian is required"),
        (["--updates", "5", "--marian", "/nonexistent/pymarian"], "cannot run it"),
    ],
)
def test_command_line_errors_are_one_line_and_touch_nothing(tmp_path, args, message):
    done = run(*args, "--out", str(tmp_path / "out"))
    assert done.returncode == 2 and done.stdout == "", done.stdout
    assert done.stderr.startswith("demo_vs_marian: error: ") and message in done.stderr
    assert done.stderr.count("\n") == 1 and not (tmp_path / "out").exists()
