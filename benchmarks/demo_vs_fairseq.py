"""Our demo against fairseq at the same recipe, data, split and budget, one after the other.

Both train the demo's recipe (``aiayn.demo.demo_train_config``): Transformer 3+3 layers,
d_model 256, h 4, d_ff 1024, post-LN, sinusoidal positions, one matrix for both embeddings and
the pre-softmax layer, no dropout, label smoothing 0.1, batches of at most 1024 padded source
and 1024 padded target tokens (fairseq: ``--max-tokens 1024`` counts max(source, target) per
sentence times the batch size, the same bound; ``--required-batch-size-multiple 1``), Adam
(0.9, 0.98, 1e-9), linear warm-up over 300 updates to the peak of our schedule
(``noam_rate`` at the end of warm-up: 0.5 * 256^-0.5 * 300^-0.5 = 1.804e-3), then inverse
square root decay (fairseq's ``inverse_sqrt`` is the same curve), no clipping or weight decay,
seed 1, ``--minutes`` of training on ``--threads`` CPU threads. fairseq's flags are built from
the TrainConfig our run saved (its config.json) and its ModelConfig (``fairseq_train_args``),
so a change to the demo's recipe reaches both.

The data is ours for both: ``aiayn.demo.prepare_bundled`` makes the sentencepiece vocabulary
and the splits; fairseq gets the same train/valid pairs as pieces (read back from our binarised
ids, so exactly the pairs our trainer sees), a dictionary holding our pieces in our id order
(``fairseq_dictionary``: fairseq's four specials take ids 0-3 as ours do, so every piece keeps
its id), ``fairseq-preprocess --joined-dictionary``, and the test sources encoded with the
same spm.model from the raw text, as ``aiayn evaluate`` encodes them.

Ours runs as ``python -m aiayn demo`` of this checkout (its own test evaluation limited to one
sentence: this script evaluates both systems itself); fairseq through its command line in the
``--fairseq-python`` interpreter. The two never run at the same time, and both get
OMP_NUM_THREADS = MKL_NUM_THREADS = ``--threads`` (fairseq also ``--num-workers 0``: no data
loader process). Time: ours counts training only (checkpoint saving and validation excluded),
fairseq's ``--stop-time-hours`` counts from its trainer's start, saving included, so fairseq
runs with ``--disable-validation``.

Checkpoints and averaging: ours saves every 1/15 of the budget (``save_every_minutes``);
fairseq has no time-based saving, so it saves every as many updates as ours made per saving
interval (``--save-interval-updates``, ``--keep-interval-updates 3``) plus its checkpoint_last
at the stop. "Last" is the final checkpoint of each; "avg3" the average of the last three
(``aiayn average --last 3``; for fairseq checkpoint_last and the two newest interval
checkpoints, averaged by ``fairseq_average.py`` since fairseq's packages do not ship its
scripts/average_checkpoints.py).

Decoding: beam 4 on the test split. Ours: alpha 0.6 with the GNMT length penalty
((5 + |Y|) / 6)^alpha, at most source length + 50 tokens. fairseq's ``--lenpen`` is not the
GNMT penalty: it divides the log-probability by |Y|^lenpen; it gets ``--lenpen 0.6`` (the same
alpha, another formula) and ``--max-len-a 1 --max-len-b 50``, which fairseq applies to the
longest source of each batch rather than to each sentence. fairseq's outputs (pieces) are
decoded with our spm.model; both systems' outputs are scored by the same SacreBLEU call
(``aiayn.metrics.sacre_bleu``, 13a, against the raw references).

Reported per system: updates, training seconds, target tokens/s (non-padding target tokens,
eos included, per training second: fairseq's "wps" yardstick; ours: over the training loop's
time, batching included; fairseq: the tokens of each epoch, wpb x updates, over its train_wall,
the time inside train_step, batching excluded), and SacreBLEU of the
last checkpoint and of the average of the last 3.

fairseq in a venv of its own (never the package's; 1.3 GB, ~6 minutes here, most of it
building fairseq's C++ extensions from its sdist):

    python3 -m venv ../peersvenv
    ../peersvenv/bin/pip install torch==2.13.0
    ../peersvenv/bin/pip install hydra-core==1.3.2 omegaconf==2.3.0 bitarray sacrebleu \\
        sentencepiece cython regex numpy packaging tqdm cffi scikit-learn setuptools
    ../peersvenv/bin/pip install --no-deps --no-build-isolation fairseq-fixed==0.12.3.1

fairseq 0.12 with torch >= 2.6 needs TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 to load its own
checkpoints (they pickle their config); this script sets it for fairseq's processes only.

    python benchmarks/demo_vs_fairseq.py --fairseq-python ../peersvenv/bin/python --minutes 15
    python benchmarks/demo_vs_fairseq.py --fairseq-python ... --minutes 0.5 --threads 1 --test-limit 20

Cost: 2 x minutes of training, plus the demo's own validation at each checkpoint and its BLEU
per checkpoint on 100 validation sentences, plus 4 beam searches of the test split (the smoke
run above took 10 minutes on a busy 2-core machine). Writes ``--out`` (default runs/peers): results.json and results.md (the table)
plus both runs; built in a temporary directory beside it and renamed; an existing ``--out`` is
replaced only if this script wrote it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
sys.path.insert(0, str(SRC))

from aiayn import checkpoint as ckpt  # noqa: E402
from aiayn.config import ModelConfig  # noqa: E402
from aiayn.data import TokenDataset, Vocab, bundled_corpus_paths  # noqa: E402
from aiayn.demo import prepare_bundled  # noqa: E402
from aiayn.errors import UserError
from aiayn.files import (
    publish_dir,
    read_lines,
    temp_dir_beside,
    write_lines_atomic,  # noqa: E402
    write_text_atomic,
)
from aiayn.metrics import sacre_bleu  # noqa: E402
from aiayn.train import TrainConfig, load_train_config  # noqa: E402
from aiayn.train.schedule import noam_rate  # noqa: E402

BENCHMARK = "demo_vs_fairseq"  # results.json's mark: an --out holding it may be replaced
AVERAGE = 3
BEAM, ALPHA, MAX_LEN_A, MAX_LEN_B = 4, 0.6, 1, 50
FAIRSEQ_SPECIALS = (
    "<s>",
    "<pad>",
    "</s>",
    "<unk>",
)  # fairseq's ids 0-3, written by Dictionary itself
SRC_LANG, TGT_LANG = "en", "es"


# ---------------------------------------------------------------------------------------------
# Pure pieces: the recipe as fairseq flags, the dictionary, reading fairseq's outputs


def fairseq_dictionary(pieces: list[str]) -> list[str]:
    """fairseq's ``dict.txt`` lines ("piece count") for our vocabulary, ``pieces[i]`` = piece of id i.

    Our ids 0-3 are pad, unk, bos, eos; fairseq puts its own four specials at 0-3 and the file's
    entries after them, so writing our pieces 4.. in id order keeps every piece's id. The count
    only orders pruning, which a given dictionary never undergoes.
    """
    lines = []
    for i, piece in enumerate(pieces[4:], start=4):
        if not piece or any(c.isspace() for c in piece):
            raise UserError(
                f"vocabulary piece {i} ({piece!r}) is empty or holds whitespace: "
                "fairseq's dictionary format cannot hold it"
            )
        if piece in FAIRSEQ_SPECIALS:
            raise UserError(f"vocabulary piece {i} is {piece!r}, one of fairseq's special symbols")
        lines.append(f"{piece} 1")
    return lines


def peak_lr(cfg: TrainConfig, model: ModelConfig) -> float:
    """The top of our schedule (end of warm-up), fairseq's ``--lr`` for ``inverse_sqrt``."""
    return noam_rate(cfg.warmup, model.d_model, cfg.warmup, cfg.lr_scale)


def fairseq_train_args(
    cfg: TrainConfig, model: ModelConfig, data_bin: Path, save_dir: Path, save_every_updates: int
) -> list[str]:
    """``fairseq-train`` arguments for our recipe ``cfg``/``model``; refuses what has no equal."""
    if model.norm != "post" or model.positional != "sinusoidal" or not model.share_embeddings:
        raise UserError("the fairseq side covers post-LN, sinusoidal, shared-embedding models only")
    if model.d_k is not None or model.d_v is not None or model.attention_window is not None:
        raise UserError("fairseq has no d_k/d_v other than d_model/h, nor restricted attention")
    if cfg.max_src_tokens != cfg.max_tgt_tokens:
        raise UserError(
            "fairseq's --max-tokens bounds source and target together: "
            "max_src_tokens and max_tgt_tokens must be equal"
        )
    if cfg.max_minutes is None:
        raise UserError("the comparison is by wall-clock budget: max_minutes must be set")
    return [
        str(data_bin),
        "--task",
        "translation",
        "--source-lang",
        SRC_LANG,
        "--target-lang",
        TGT_LANG,
        "--arch",
        "transformer",
        "--share-all-embeddings",
        "--encoder-layers",
        str(model.N_enc),
        "--decoder-layers",
        str(model.N_dec),
        "--encoder-embed-dim",
        str(model.d_model),
        "--decoder-embed-dim",
        str(model.d_model),
        "--encoder-ffn-embed-dim",
        str(model.d_ff),
        "--decoder-ffn-embed-dim",
        str(model.d_ff),
        "--encoder-attention-heads",
        str(model.h),
        "--decoder-attention-heads",
        str(model.h),
        "--max-source-positions",
        str(model.max_len),
        "--max-target-positions",
        str(model.max_len),
        "--activation-fn",
        "relu",
        "--dropout",
        str(model.P_drop),
        "--attention-dropout",
        str(model.attention_dropout),
        "--activation-dropout",
        "0",
        "--criterion",
        "label_smoothed_cross_entropy",
        "--label-smoothing",
        str(cfg.eps_ls),
        "--optimizer",
        "adam",
        "--adam-betas",
        f"({cfg.adam_beta1}, {cfg.adam_beta2})",
        "--adam-eps",
        str(cfg.adam_eps),
        "--weight-decay",
        "0",
        "--clip-norm",
        "0",
        "--lr",
        repr(peak_lr(cfg, model)),
        "--lr-scheduler",
        "inverse_sqrt",
        "--warmup-updates",
        str(cfg.warmup),
        "--warmup-init-lr",
        "0",
        "--max-tokens",
        str(cfg.max_src_tokens),
        "--required-batch-size-multiple",
        "1",
        "--update-freq",
        str(cfg.update_freq),
        "--seed",
        str(cfg.seed),
        "--stop-time-hours",
        repr(cfg.max_minutes / 60),
        "--save-dir",
        str(save_dir),
        "--save-interval-updates",
        str(save_every_updates),
        "--keep-interval-updates",
        str(AVERAGE),
        "--no-epoch-checkpoints",
        "--disable-validation",
        "--cpu",
        "--num-workers",
        "0",
        "--log-format",
        "json",
        "--log-interval",
        str(cfg.log_every),
    ]


def fairseq_generate_args(data_bin: Path, checkpoint: Path) -> list[str]:
    """``fairseq-generate`` arguments: beam 4 on the test subset; ``--lenpen`` is |Y|^0.6, not GNMT's."""
    return [
        str(data_bin),
        "--task",
        "translation",
        "--source-lang",
        SRC_LANG,
        "--target-lang",
        TGT_LANG,
        "--path",
        str(checkpoint),
        "--gen-subset",
        "test",
        "--beam",
        str(BEAM),
        "--lenpen",
        str(ALPHA),
        "--max-len-a",
        str(MAX_LEN_A),
        "--max-len-b",
        str(MAX_LEN_B),
        "--batch-size",
        "64",
        "--required-batch-size-multiple",
        "1",  # with fairseq's default 8 it dropped 4 of 20 sentences
        "--cpu",
        "--num-workers",
        "0",
    ]


def save_every_updates(cfg: TrainConfig, updates: int) -> int:
    """Updates between fairseq's checkpoints: as many as ours made per saving interval."""
    savings = cfg.max_minutes / cfg.save_every_minutes
    return max(1, round(updates / savings))


def read_fairseq_train_log(lines: list[str]) -> dict[str, float]:
    """Updates, target tokens and train_wall seconds from fairseq-train's json log.

    fairseq prints one end-of-epoch line per epoch, also for the epoch cut by
    ``--stop-time-hours``, with that epoch's mean target tokens per update (``train_wpb``), the
    cumulative update count and the epoch's seconds inside train_step (``train_train_wall``).
    """
    updates, tokens, seconds = 0, 0.0, 0.0
    for line in lines:
        start = line.find("{")
        if start < 0:
            continue
        try:
            record = json.loads(line[start:])
        except json.JSONDecodeError:
            continue
        if (
            not isinstance(record, dict)
            or "epoch" not in record
            or "train_num_updates" not in record
        ):
            continue
        now = int(record["train_num_updates"])
        tokens += float(record["train_wpb"]) * (now - updates)
        seconds += float(record["train_train_wall"])
        updates = now
    if not updates:
        raise UserError("fairseq-train's log holds no end-of-epoch line: it made no update")
    return {"updates": updates, "target_tokens": tokens, "train_s": seconds}


def read_fairseq_hypotheses(lines: list[str], n: int) -> list[list[str]]:
    """The pieces of fairseq-generate's best hypothesis (``H-id<TAB>score<TAB>pieces``) per
    sentence, in test-set order; every sentence 0..n-1 must have one."""
    found: dict[int, list[str]] = {}
    for line in lines:
        m = re.match(r"H-(\d+)\t[^\t]*\t?(.*)$", line)
        if m:
            found.setdefault(int(m[1]), m[2].split())
    missing = [i for i in range(n) if i not in found]
    if missing:
        raise UserError(
            f"fairseq-generate gave no hypothesis for {len(missing)} of {n} sentences "
            f"(first: {missing[0]})"
        )
    return [found[i] for i in range(n)]


def averaged_inputs(save_dir_names: list[str], last_update: int) -> list[str]:
    """The fairseq checkpoints to average, oldest first: the newest interval checkpoints
    (checkpoint_EPOCH_UPDATE.pt) before the last update, then checkpoint_last.pt."""
    interval = []
    for name in save_dir_names:
        m = re.fullmatch(r"checkpoint_\d+_(\d+)\.pt", name)
        if m and int(m[1]) < last_update:
            interval.append((int(m[1]), name))
    return [name for _, name in sorted(interval)[-(AVERAGE - 1) :]] + ["checkpoint_last.pt"]


def format_table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| system | updates | train s | target tok/s | SacreBLEU last | SacreBLEU avg 3 |\n"
        "|---|---:|---:|---:|---:|---:|\n"
    )
    return head + "".join(
        f"| {r['system']} | {r['updates']:,} | {r['train_s']:.0f} | {r['target_tokens_per_s']:,.0f} "
        f"| {r['sacrebleu_last']:.2f} | {r['sacrebleu_avg3']:.2f} |\n"
        for r in rows
    )


# ---------------------------------------------------------------------------------------------
# Running the two systems


def run(cmd: list[str], env: dict[str, str], log: Path, what: str) -> list[str]:
    """Run ``cmd`` with its output to ``log`` (and back as lines); a failure names the log."""
    with open(log, "w", encoding="utf-8") as f:
        rc = subprocess.run(
            cmd, env=env, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        ).returncode
    lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    if rc:
        tail = "\n".join(lines[-15:])
        raise RuntimeError(f"{what} failed (exit {rc}); its log is {log}:\n{tail}")
    return lines


def thread_env(threads: int, **extra: str) -> dict[str, str]:
    """The environment of a child: ``threads`` for OpenMP and MKL, no PYTHONPATH but ``extra``'s."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), **extra}


def test_split(tmp: Path, limit: int | None) -> tuple[Path, Path]:
    """The bundled test split (or its first ``limit`` pairs) as plain files."""
    src, ref = (read_lines(p) for p in bundled_corpus_paths()["test"])
    src, ref = src[:limit], ref[:limit]
    write_lines_atomic(tmp / "test.en", src)
    write_lines_atomic(tmp / "test.es", ref)
    return tmp / "test.en", tmp / "test.es"


def run_ours(
    tmp: Path, work: Path, args: argparse.Namespace, test: tuple[Path, Path], average: bool = True
) -> dict:
    """``aiayn demo --minutes`` of this checkout, then beam search on ``test`` with its last
    checkpoint and (``average``) the average of its last 3; demo_vs_marian.py scores the last
    only."""
    env = thread_env(args.threads, PYTHONPATH=str(SRC))
    aiayn = [sys.executable, "-m", "aiayn"]
    out = tmp / "ours"
    run(
        aiayn
        + [
            "demo",
            "--minutes",
            repr(args.minutes),
            "--work",
            str(work),
            "--out",
            str(out),
            "--test-limit",
            "1",
        ]
        + [word for override in args.set or [] for word in ("--set", override)],
        env,
        tmp / "ours.demo.log",
        "aiayn demo",
    )
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    last = ckpt.list_checkpoints(out / "checkpoints")[-1]
    models = {"last": last}
    if average:
        models["avg3"] = tmp / "ours-avg3"
        run(
            aiayn
            + [
                "average",
                str(out / "checkpoints"),
                "--last",
                str(AVERAGE),
                "--out",
                str(models["avg3"]),
            ],
            env,
            tmp / "ours.average.log",
            "aiayn average",
        )
    hyps = {}
    for name, model in models.items():
        hyp = tmp / f"ours.{name}.hyp.es"
        run(
            aiayn
            + [
                "evaluate",
                "--checkpoint",
                str(model),
                "--src",
                str(test[0]),
                "--ref",
                str(test[1]),
                "--lang",
                TGT_LANG,
                "--beam",
                str(BEAM),
                "--alpha",
                str(ALPHA),
                "--output",
                str(hyp),
            ],
            env,
            tmp / f"ours.evaluate.{name}.log",
            "aiayn evaluate",
        )
        hyps[name] = read_lines(hyp)
    return {
        "system": "aiayn (ours)",
        "updates": summary["updates"],
        "train_s": summary["elapsed_s"],
        "target_tokens": summary["tokens"]["tgt"],
        "hypotheses": hyps,
        "averaged": [p.name for p in ckpt.list_checkpoints(out / "checkpoints")[-AVERAGE:]],
    }


def write_fairseq_text(tmp: Path, work: Path, vocab: Vocab, test: tuple[Path, Path]) -> Path:
    """Pieces for fairseq-preprocess: train/valid from our binarised ids, test from raw text."""
    text = tmp / "fairseq" / "text"
    text.mkdir(parents=True)
    for split in ("train", "valid"):
        data = TokenDataset(work, split)
        for side, get in ((SRC_LANG, data.src), (TGT_LANG, data.tgt)):
            write_lines_atomic(
                text / f"{split}.{side}",
                (" ".join(vocab.sp.id_to_piece(get(i).tolist())) for i in range(len(data))),
            )
    for side, path in zip((SRC_LANG, TGT_LANG), test):
        pieces = vocab.sp.encode(read_lines(path), out_type=str)
        write_lines_atomic(text / f"test.{side}", (" ".join(p) for p in pieces))
    pieces = [vocab.sp.id_to_piece(i) for i in range(len(vocab))]
    write_lines_atomic(tmp / "fairseq" / "dict.txt", fairseq_dictionary(pieces))
    return text


def run_fairseq(
    tmp: Path,
    work: Path,
    cfg: TrainConfig,
    model: ModelConfig,
    args: argparse.Namespace,
    test: tuple[Path, Path],
    ours_updates: int,
) -> dict:
    vocab = Vocab.load(work / "spm.model")
    text = write_fairseq_text(tmp, work, vocab, test)
    fs = tmp / "fairseq"
    py = [args.fairseq_python]
    env = thread_env(args.threads, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1")
    data_bin, save_dir = fs / "data-bin", fs / "checkpoints"
    run(
        py
        + [
            "-m",
            "fairseq_cli.preprocess",
            "--source-lang",
            SRC_LANG,
            "--target-lang",
            TGT_LANG,
            "--trainpref",
            str(text / "train"),
            "--validpref",
            str(text / "valid"),
            "--testpref",
            str(text / "test"),
            "--destdir",
            str(data_bin),
            "--srcdict",
            str(fs / "dict.txt"),
            "--joined-dictionary",
            "--workers",
            "1",
        ],
        env,
        fs / "preprocess.log",
        "fairseq-preprocess",
    )
    interval = save_every_updates(cfg, ours_updates)
    log = run(
        py
        + ["-m", "fairseq_cli.train"]
        + fairseq_train_args(cfg, model, data_bin, save_dir, interval),
        env,
        fs / "train.log",
        "fairseq-train",
    )
    trained = read_fairseq_train_log(log)
    inputs = averaged_inputs(sorted(p.name for p in save_dir.iterdir()), trained["updates"])
    run(
        py
        + [str(HERE / "fairseq_average.py"), str(fs / "avg3.pt")]
        + [str(save_dir / n) for n in inputs],
        env,
        fs / "average.log",
        "fairseq checkpoint averaging",
    )
    n = len(read_lines(test[0]))
    hyps = {}
    for name, model_file in (("last", save_dir / "checkpoint_last.pt"), ("avg3", fs / "avg3.pt")):
        out = run(
            py + ["-m", "fairseq_cli.generate"] + fairseq_generate_args(data_bin, model_file),
            env,
            fs / f"generate.{name}.log",
            "fairseq-generate",
        )
        hyps[name] = [vocab.sp.decode_pieces(p) for p in read_fairseq_hypotheses(out, n)]
        write_lines_atomic(fs / f"{name}.hyp.es", hyps[name])
    return {
        "system": f"fairseq {args.fairseq_version}",
        "updates": trained["updates"],
        "train_s": trained["train_s"],
        "target_tokens": trained["target_tokens"],
        "hypotheses": hyps,
        "averaged": inputs,
        "save_every_updates": interval,
    }


def check_out(out: Path, benchmark: str = BENCHMARK) -> None:
    """Refuse to replace an ``--out`` that ``benchmark`` (this script by default) did not write."""
    if not (out.exists() or out.is_symlink()):
        return
    mark = out / "results.json"
    try:
        ours = (
            not out.is_symlink()
            and json.loads(mark.read_text(encoding="utf-8")).get("benchmark") == benchmark
        )
    except (OSError, ValueError, AttributeError):
        ours = False
    if not ours:
        raise UserError(
            f"{out} exists and was not written by this script (no {mark} of {benchmark}); "
            "choose another --out"
        )


def fairseq_version(python: str) -> str:
    try:
        done = subprocess.run(
            [python, "-c", "import fairseq, torch; print(fairseq.__version__, torch.__version__)"],
            capture_output=True,
            text=True,
            env=thread_env(1),
        )
    except OSError as e:
        raise UserError(f"--fairseq-python {python}: cannot run it ({e.strerror})") from None
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        raise UserError(
            f"--fairseq-python {python}: cannot import fairseq ({last}); see this script's "
            "docstring for the venv"
        )
    return done.stdout.split()[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fairseq-python", help="python of the venv that holds fairseq (required)")
    p.add_argument("--minutes", type=float, default=15.0, help="training budget of each system")
    p.add_argument("--threads", type=int, default=2, help="CPU threads of each system")
    p.add_argument(
        "--test-limit", type=int, help="score the first N test sentences only (smoke runs)"
    )
    p.add_argument("--out", default="runs/peers", help="results and both runs")
    p.add_argument("--record", help="write the comparison as a record into this folder")
    p.add_argument(
        "--dry-run",
        type=int,
        metavar="UPDATES",
        help="print, as JSON, the fairseq-train and fairseq-generate arguments for a run of ours "
        "that made UPDATES updates (the demo recipe at --minutes), and the dictionary of PIECES "
        "(one a line, from --pieces); nothing is run or written",
    )
    p.add_argument("--pieces", type=Path, help="--dry-run: our vocabulary, a piece a line by id")
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="a variant of the demo recipe for both systems (aiayn demo --set)",
    )
    args = p.parse_args()
    if args.dry_run is not None:
        try:
            print(json.dumps(dry_run(args), indent=1, ensure_ascii=False))
        except UserError as e:
            print(f"{BENCHMARK}: error: {e}", file=sys.stderr)
            raise SystemExit(2) from None
        return
    if not args.fairseq_python:
        p.error("--fairseq-python is required (but for --dry-run)")
    try:
        if not (math.isfinite(args.minutes) and args.minutes > 0):
            raise UserError(f"--minutes must be a positive number, got {args.minutes}")
        if args.threads < 1 or (args.test_limit is not None and args.test_limit < 1):
            raise UserError("--threads and --test-limit must be at least 1")
        out = Path(args.out).resolve()
        check_out(out)
        args.fairseq_version = fairseq_version(args.fairseq_python)
    except UserError as e:
        print(f"{BENCHMARK}: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None

    tmp = temp_dir_beside(out)
    print(f"working in {tmp}")
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    work = tmp / "work"
    prepare_bundled(work)
    test = test_split(tmp, args.test_limit)
    print(
        f"[1/2] ours: aiayn demo --minutes {args.minutes:g}, then the last checkpoint and the last {AVERAGE} "
        "averaged on the test split"
    )
    ours = run_ours(tmp, work, args, test)
    cfg = load_train_config(tmp / "ours" / "config.json")  # the recipe ours trained with, resolved
    model = cfg.model_config(len(Vocab.load(work / "spm.model")))
    print(f"[2/2] fairseq {args.fairseq_version}: the same recipe, data and budget")
    theirs = run_fairseq(tmp, work, cfg, model, args, test, ours["updates"])

    references = read_lines(test[1])
    rows, signature = [], ""
    for system in (ours, theirs):
        row = {k: v for k, v in system.items() if k != "hypotheses"}
        row["target_tokens_per_s"] = system["target_tokens"] / system["train_s"]
        for name, hyps in system["hypotheses"].items():
            row[f"sacrebleu_{name}"], signature = sacre_bleu(hyps, references)
        rows.append(row)
    results = {
        "benchmark": BENCHMARK,
        "started": started,
        "minutes": args.minutes,
        "threads": args.threads,
        "test_sentences": len(references),
        "beam": BEAM,
        "alpha": ALPHA,
        "peak_lr": peak_lr(cfg, model),
        "sacrebleu_signature": signature,
        "rows": rows,
    }
    table = format_table(rows)
    write_text_atomic(tmp / "results.json", json.dumps(results, indent=2))
    write_text_atomic(
        tmp / "results.md",
        f"{args.minutes:g} minutes of training each, {args.threads} thread(s), "
        f"{len(references)} test sentences, beam {BEAM}\n\n{table}",
    )
    publish_dir(tmp, out)
    print(f"\n{table}\nSacreBLEU {signature}\nwrote {out}/results.json and results.md")
    if args.record:
        record(rows, args, len(references))


def dry_run(args: argparse.Namespace) -> dict[str, Any]:
    """The fairseq side of the comparison as data: what would be run, for a look or a test."""
    from aiayn.data.prepare import BUNDLED_VOCAB_SIZE
    from aiayn.demo import demo_train_config

    placeholder = Path("WORK")
    cfg = demo_train_config(placeholder, placeholder / "ours", args.minutes, args.set or [])
    model = cfg.model_config(BUNDLED_VOCAB_SIZE)
    save_every = save_every_updates(cfg, args.dry_run)
    bin_, save = placeholder / "bin", placeholder / "checkpoints"
    pieces = read_lines(args.pieces) if args.pieces else None
    return {
        "train": fairseq_train_args(cfg, model, bin_, save, save_every),
        "generate": fairseq_generate_args(bin_, save / "average.pt"),
        "dictionary": fairseq_dictionary(pieces) if pieces is not None else None,
    }


def record(rows: list[dict[str, Any]], args: argparse.Namespace, sentences: int) -> None:
    """Ours against fairseq as a record (``aiayn.records``, topic demo)."""
    from aiayn.records import make_record, write_record

    ours, theirs = rows
    rec = make_record(
        topic="demo",
        what=f"the demo recipe, ours against fairseq, {args.minutes:g} minutes each",
        figures={
            "SacreBLEU, last 3 averaged": f"{ours['sacrebleu_avg3']:.2f} / "
            f"{theirs['sacrebleu_avg3']:.2f}",
            "target tokens/s": f"{ours['target_tokens_per_s']:,.0f} / "
            f"{theirs['target_tokens_per_s']:,.0f}",
            "updates": f"{ours['updates']:,} / {theirs['updates']:,}",
        },
        command="benchmarks/demo_vs_fairseq.py " + " ".join(sys.argv[1:]),
        threads=args.threads,
        peers={"fairseq": args.fairseq_version},
        notes=f"ours / fairseq; {sentences} test sentences, beam {BEAM}",
    )
    print(f"wrote {write_record(rec, args.record)}")


if __name__ == "__main__":
    try:
        main()
    except (
        RuntimeError,
        UserError,
    ) as e:  # a child failed or gave what we cannot read: its log is kept
        print(f"{BENCHMARK}: {e}", file=sys.stderr)
        raise SystemExit(1) from None
