"""Oracle: a model fairseq trained, imported (``aiayn import``), translates as fairseq-generate.

Opt-in (``pytest -m oracle``), and skipped unless ``AIAYN_FAIRSEQ_PYTHON`` names the python of
a venv holding fairseq (benchmarks/demo_vs_fairseq.py says how to make one):

    AIAYN_FAIRSEQ_PYTHON=../peersvenv/bin/python \\
        .venv/bin/python -m pytest -m oracle tests/test_fairseq_oracle.py -s

fairseq-preprocess binarises the bundled corpus split by a SentencePiece model trained here
(one dictionary), fairseq-train trains a 2+2-layer transformer with all embeddings shared for
300 updates (a few minutes on one thread), and fairseq-generate translates the first 200
sentences of the test split (beam 5, lenpen 1, its defaults). The import, under
``--search-rules fairseq`` with the defaults it records, must give the same pieces for every
sentence, and our model the same log-probability of each of fairseq's tokens within 1e-4.
"""

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import sentencepiece as spm
from _export_models import corpus_lines

from aiayn.checkpoint import load_translator, search_defaults
from aiayn.decode import DecodeConfig, SearchRequest, decode_ids
from aiayn.decode.score import score_ids
from aiayn.export.fairseq_import import import_fairseq

SENTENCES, TRAIN, UPDATES = 200, 6000, 300
ARCH = [
    "--arch", "transformer", "--encoder-layers", "2", "--decoder-layers", "2",
    "--encoder-embed-dim", "64", "--decoder-embed-dim", "64", "--encoder-ffn-embed-dim", "128",
    "--decoder-ffn-embed-dim", "128", "--encoder-attention-heads", "4",
    "--decoder-attention-heads", "4", "--share-all-embeddings",
]  # fmt: skip
TRAINING = [
    "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "1e-3",
    "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "100",
    "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
    "--max-tokens", "2000", "--max-update", str(UPDATES), "--dropout", "0.1", "--seed", "1",
    "--cpu", "--num-workers", "0", "--disable-validation", "--no-epoch-checkpoints",
]  # fmt: skip

pytestmark = [
    pytest.mark.oracle,
    pytest.mark.skipif(
        not os.environ.get("AIAYN_FAIRSEQ_PYTHON"),
        reason="fairseq runs in its own interpreter: set AIAYN_FAIRSEQ_PYTHON "
        "(benchmarks/demo_vs_fairseq.py says how to make one)",
    ),
]


def fairseq(tool: str, *args: str, cwd: Path) -> str:
    """``fairseq-TOOL args`` in fairseq's venv; its standard output."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = "1"  # fairseq 0.12 loading its own checkpoint
    command = [os.environ["AIAYN_FAIRSEQ_PYTHON"], "-m", f"fairseq_cli.{tool}", *args]
    run = subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


def write_split(model: spm.SentencePieceProcessor, work: Path, split: str, n: int) -> None:
    for side, lang in ((0, "en"), (1, "es")):
        lines = [" ".join(model.encode(x, out_type=str)) for x in corpus_lines(split, side, n)]
        (work / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")


def generated(output: str) -> dict[int, tuple[list[str], list[float]]]:
    """fairseq-generate's best output per sentence id: its pieces (no </s>) and the natural
    log-probability of each piece and of the final </s> (it prints them in base 2)."""
    found: dict[int, tuple[list[str], list[float]]] = {}
    for line in output.splitlines():
        kind, _, rest = line.partition("-")
        if kind == "H":
            i, _, pieces = rest.split("\t")
            found[int(i)] = (pieces.split(), [])
        elif kind == "P":
            i, scores = rest.split("\t")
            found[int(i)][1].extend(float(s) * math.log(2) for s in scores.split())
    return found


def train(work: Path) -> Path:
    """The model fairseq trains on the bundled corpus; the directory of its checkpoint."""
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus_lines("train", 0, TRAIN) + corpus_lines("train", 1, TRAIN)),
        model_prefix=str(work / "spm"), vocab_size=1000, minloglevel=2, num_threads=1,
    )  # fmt: skip
    model = spm.SentencePieceProcessor(model_file=str(work / "spm.model"))
    for split, n in (("train", TRAIN), ("valid", 100), ("test", SENTENCES)):
        write_split(model, work, split, n)
    prefixes = [f"--{s}pref" for s in ("train", "valid", "test")]
    fairseq(
        "preprocess", "--source-lang", "en", "--target-lang", "es", "--joined-dictionary",
        prefixes[0], "train", prefixes[1], "valid", prefixes[2], "test",
        "--destdir", "bin", "--workers", "1", cwd=work,
    )  # fmt: skip
    fairseq("train", "bin", *ARCH, *TRAINING, "--save-dir", "ckpt", cwd=work)
    for lang in ("en", "es"):
        (work / "ckpt" / f"dict.{lang}.txt").write_bytes((work / "bin" / f"dict.{lang}.txt").read_bytes())  # fmt: skip
    return work / "ckpt"


def test_an_imported_fairseq_model_translates_as_fairseq_generate(tmp_path):
    ckpt = train(tmp_path)
    theirs = generated(
        fairseq(
            "generate",
            "bin",
            "--path",
            "ckpt/checkpoint_last.pt",
            "--gen-subset",
            "test",
            "--beam",
            "5",
            "--lenpen",
            "1",
            "--batch-size",
            "1",
            # fairseq's batch_by_size drops the longest sentence when a batch of one must be a
            # multiple of its default 8
            "--required-batch-size-multiple",
            "1",
            "--cpu",
            cwd=tmp_path,
        )  # fmt: skip
    )
    assert sorted(theirs) == list(range(SENTENCES))
    import_fairseq(  # fairseq-train read the languages off bin/'s file names: given here
        ckpt / "checkpoint_last.pt",
        tmp_path / "ours",
        spm=(tmp_path / "spm.model",) * 2,
        languages=("en", "es"),
    )
    model, vocab = load_translator(tmp_path / "ours")
    sources = corpus_lines("test", 0, SENTENCES)
    ids = [vocab.encode_source(s) for s in sources]
    config = DecodeConfig.choose(own=search_defaults(tmp_path / "ours"), rules="fairseq")
    assert (config.beam, config.alpha) == (5, 1.0)
    ours = [h[0].tokens for h in decode_ids(model, ids, SearchRequest(config))]
    same = [[vocab.id_to_piece(t) for t in o] == theirs[i][0] for i, o in enumerate(ours)]
    targets = [[vocab.piece_to_id(p) for p in theirs[i][0]] + [vocab.eos_id] for i in range(SENTENCES)]  # fmt: skip
    scored = score_ids(model, ids, targets)
    worst = max(
        max(abs(a - b) for a, b in zip(s.token_log_probs, theirs[i][1], strict=True))
        for i, s in enumerate(scored)
    )
    print(f"{sum(same)}/{len(same)} outputs equal, max |log-prob diff| {worst:.2e}", file=sys.stderr)  # fmt: skip
    assert sum(same) == len(same)
    assert worst < 1e-4
