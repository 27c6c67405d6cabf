"""Our demo against Marian (C++, pymarian's trainer) at the same recipe, data and threads.

Two modes. ``--updates N``: both train N updates, in the order ours, Marian, Marian, ours
(A-B-B-A), for target tokens/s and their ratio, no BLEU (quick). ``--minutes M``: ours runs
``aiayn demo --minutes M``, Marian trains for M minutes of its own training time (its log's
``Time``, summed; SIGTERM then, which Marian answers by saving and exiting), and the last model
of each decodes the test split with beam 4, scored by the same SacreBLEU call
(``aiayn.metrics.sacre_bleu``, 13a, against the raw references).

The recipe is the demo's (``aiayn.demo.demo_train_config``, or the config.json our run saved),
turned into Marian's flags by ``marian_train_args``, which refuses what Marian would train
differently: ``--type transformer``, 3+3 layers (``--enc-depth``/``--dec-depth``), d_model 256
(``--dim-emb``), h 4, d_ff 1024 with ReLU (Marian's default is swish), post-LN (empty
``--transformer-preprocess``, ``--transformer-postprocess dan``), sinusoidal positions (Marian's
default), one matrix for both embeddings and the pre-softmax layer (``--tied-embeddings-all``)
and no output bias (``--output-omit-bias``), no dropout, label smoothing 0.1, the loss averaged
over target tokens (``--cost-type ce-mean-words``, ours), Adam (0.9, 0.98, 1e-9), no clipping
(Marian clips at 1 by default), linear warm-up over 300 updates to the peak of our schedule
(``--lr-warmup 300``, ``--learn-rate`` = ``peak_lr``) then inverse square root decay
(``--lr-decay-inv-sqrt 300``: lr * sqrt(300 / update), the same curve), seed 1, ``--cpu-threads
N --sync-sgd`` (N workers, one thread each, one model: Marian's data-parallel CPU training,
which splits each batch across the workers: its log shows the same sentences an update at 1
and 2 threads). Ours trains as the demo does (``amp: auto``: fp32 on a CPU without native bf16;
``--set amp=none`` for fp32 everywhere).
Batches: ``--mini-batch-words 1024`` counts target labels (pieces plus EOS, unpadded) and closes
a batch once it passes 1024, so Marian's batches hold a few per cent more target tokens than
ours (at most 1024 padded target tokens): both averages are printed and recorded
(``tokens/update``). ``--mini-batch 1000`` keeps Marian's sentence cap (64) from binding,
``--max-length`` is our max_len (Marian drops pairs over 50 by default), one data thread.
Where they still differ: Marian's linear layers keep their biases as ours do, but Marian's
initialisation (Glorot uniform) and shuffling are its own.

The data is ours for both. Marian reads our sentencepiece model as its vocabulary (copied as
``vocab.spm``: Marian loads a SentencePiece model when the name ends in .spm), for both sides,
so every piece has our id (Marian looks pieces up in the same model; ids 0-3 are ours, and
Marian takes its EOS and UNK from the model). The training pairs are written as pieces read
back from our binarised ids (``export_pairs``: exactly the pairs our trainer sees) and read with
``--no-spm-encode``, so Marian tokenises nothing; the test sources are encoded with our spm.model
from the raw text, as ``aiayn evaluate`` encodes them, and Marian decodes its output to text
with the same model. Its log confirms the count: the labels of one epoch, words/s x Time summed
over its lines, are our target tokens plus one EOS per pair.

Tokens/s: target tokens (EOS included) per training second. Ours: over the training loop's
time, batching included (summary.json). Marian: its log's ``words/s``, which counts target labels
(EOS included), over its ``Time``, from the start of training (graph building included), as
``--disp-freq 1u`` prints them every update (``read_marian_log``).

Decoding: beam 4. Ours: alpha 0.6 with the GNMT length penalty, at most source length + 50.
Marian: ``--normalize 0.6`` divides the log-probability by |Y|^0.6 (the same alpha, another
formula, as fairseq's ``--lenpen``), at most 3 x the source length (Marian's default
``--max-length-factor``; it has no additive bound).

Marian lives in a venv of its own (never the package's): ``python3 -m venv ../marianvenv &&
../marianvenv/bin/pip install pymarian==1.12.42``; ``--marian`` names its ``pymarian``.

    python benchmarks/demo_vs_marian.py --marian ../marianvenv/bin/pymarian --updates 400 \\
        --threads 2 --record records
    python benchmarks/demo_vs_marian.py --marian ../marianvenv/bin/pymarian --minutes 15 \\
        --threads 2 --record records

Cost: ``--updates``: 4 runs of N updates (about 0.4 s an update each on 2 cores) plus preparing
the bundled corpus once (~1 min). ``--minutes``: 2 x M minutes, the demo's own checkpoints and
validation, and 2 beam searches of the test split. Writes ``--out`` (default runs/marian):
results.json and results.md plus both runs; built beside it and renamed; an existing ``--out``
is replaced only if this script wrote it.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import signal
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from demo_vs_fairseq import SRC, check_out, peak_lr, run, run_ours, test_split, thread_env  # noqa: E402

from aiayn.config import ModelConfig
from aiayn.data import TokenDataset, Vocab
from aiayn.demo import prepare_bundled
from aiayn.errors import UserError
from aiayn.files import (
    publish_dir,
    read_lines,
    temp_dir_beside,
    write_lines_atomic,
    write_text_atomic,
)
from aiayn.metrics import sacre_bleu
from aiayn.train import TrainConfig, load_train_config

BENCHMARK = "demo_vs_marian"  # results.json's mark: an --out holding it may be replaced
BEAM, NORMALIZE, MAX_LENGTH_FACTOR = 4, 0.6, 3
# Marian's display line for an update (--disp-freq 1u); with ce-mean-words it shows no label
# count, so the labels are words/s x Time
DISPLAY = re.compile(r"Ep\. \d+ : Up\. (\d+) : .*: Time ([\d.]+)s : ([\d.]+) words/s")

# what a run of ours executes (aiayn.measure.train's run): the demo recipe for N updates, no
# checkpoint schedule, no BLEU; its summary's figures on stdout
OURS_UPDATES = """
import json, sys
from aiayn.train.config import recipe_config
from aiayn.train.trainer import Trainer
data, out, updates, threads = sys.argv[1:5]
cfg = recipe_config(
    "demo", sys.argv[5:], data=data, out=out, max_minutes=None, max_updates=int(updates),
    save_every_minutes=None, save_every_updates=None, valid_bleu_sentences=0,
    num_threads=int(threads), seed=1,
)
s = Trainer(cfg).run(resume=None)
print(json.dumps({"updates": s["updates"], "train_s": s["elapsed_s"],
    "target_tokens": s["tokens"]["tgt"]}))
"""


# ---------------------------------------------------------------------------------------------
# Pure pieces: the recipe as Marian flags, its log, the pairs as it reads them


def marian_train_args(
    cfg: TrainConfig, model: ModelConfig, pairs: tuple[Path, Path], vocab: Path, out: Path,
    threads: int,
) -> list[str]:  # fmt: skip
    """Marian's training flags for our recipe ``cfg``/``model``; refuses what has no equal.
    The budget (``--after``) is the caller's: an update count, or none (stopped by signal)."""
    if model.norm != "post" or model.positional != "sinusoidal" or not model.share_embeddings:
        raise UserError("the Marian side covers post-LN, sinusoidal, shared-embedding models only")
    if model.d_k is not None or model.d_v is not None or model.attention_window is not None:
        raise UserError("Marian has no d_k/d_v other than d_model/h, nor restricted attention")
    if not model.scale_attention or model.output_bias or model.activation == "gelu":
        raise UserError("Marian scales attention, has no gelu, and the recipe has no output bias")
    if cfg.ema_decay is not None:
        raise UserError("ema_decay: Marian's --exponential-smoothing is another average")
    tied = ["--tied-embeddings-all", "--output-omit-bias"]
    shape = ["--type", "transformer", "--enc-depth", str(model.N_enc), "--dec-depth"]
    shape += [str(model.N_dec), "--dim-emb", str(model.d_model), "--transformer-heads"]
    shape += [str(model.h), "--transformer-dim-ffn", str(model.d_ff)]
    shape += ["--transformer-ffn-activation", model.activation, "--transformer-preprocess", ""]
    shape += ["--transformer-postprocess", "dan", "--transformer-postprocess-emb", "d"]
    drop = ["--transformer-dropout", str(model.P_drop), "--transformer-dropout-attention"]
    drop += [str(model.attention_dropout), "--transformer-dropout-ffn", "0"]
    loss = ["--cost-type", "ce-mean-words", "--label-smoothing", str(cfg.eps_ls)]
    adam = ["--optimizer", "adam", "--optimizer-params", str(cfg.adam_beta1)]
    adam += [str(cfg.adam_beta2), str(cfg.adam_eps), "--clip-norm", "0"]
    adam += ["--learn-rate", repr(peak_lr(cfg, model)), "--lr-warmup", str(cfg.warmup)]
    adam += ["--lr-decay-inv-sqrt", str(cfg.warmup), "--optimizer-delay", str(cfg.update_freq)]
    batch = ["--mini-batch-words", str(cfg.max_tgt_tokens), "--mini-batch", "1000"]
    batch += ["--max-length", str(model.max_len), "--no-spm-encode", "--data-threads", "1"]
    run_ = ["--seed", str(cfg.seed), "--cpu-threads", str(threads), "--sync-sgd"]
    run_ += ["--disp-freq", "1u", "--save-freq", "1000000u", "--sigterm", "save-and-exit"]
    files = ["--model", str(out / "model.npz"), "--train-sets", *map(str, pairs)]
    files += ["--vocabs", str(vocab), str(vocab), "--tempdir", str(out)]
    return files + shape + tied + drop + loss + adam + batch + run_


def marian_decode_args(model: Path, vocab: Path, src: Path, out: Path, threads: int) -> list[str]:
    """``pymarian decode`` flags: beam 4, Marian's length normalisation, pieces in, text out."""
    return ["decode", "--models", str(model), "--vocabs", str(vocab), str(vocab)] + [
        "--input", str(src), "--output", str(out), "--no-spm-encode",
        "--beam-size", str(BEAM), "--normalize", str(NORMALIZE),
        "--max-length-factor", str(MAX_LENGTH_FACTOR), "--cpu-threads", str(threads),
        "--mini-batch", "32", "--maxi-batch", "100", "--quiet-translation",
    ]  # fmt: skip


def read_marian_log(lines: list[str]) -> dict[str, float]:
    """Updates, target labels and training seconds from Marian's per-update display lines
    (``Ep. 1 : Up. 7 : Sen. 96 : Cost 6.1 : Time 3.51s : 294.60 words/s``): each line's Time
    covers the updates since the line before, its words/s the target labels of those updates
    (EOS included) over that Time."""
    updates, labels, seconds = 0, 0.0, 0.0
    for line in lines:
        m = DISPLAY.search(line)
        if m:
            updates = int(m[1])
            labels += float(m[2]) * float(m[3])
            seconds += float(m[2])
    if not updates:
        raise UserError("Marian's log holds no display line (Ep. : Up. : Time : words/s)")
    return {"updates": updates, "target_tokens": labels, "train_s": seconds}


def export_pairs(work: Path, out: Path, max_len: int) -> tuple[Path, Path]:
    """The training pairs of the prepared corpus ``work`` as Marian reads them with
    ``--no-spm-encode``: a line of space-separated pieces per sentence, read back from our
    binarised ids, so exactly the pairs our trainer sees; a pair over ``max_len`` is refused
    (Marian would drop it)."""
    vocab, data = Vocab.load(work / "spm.model"), TokenDataset(work, "train")
    longest = int(max(data.src_lens.max(), data.tgt_lens.max())) + 1  # + EOS
    if longest > max_len:
        raise UserError(f"{work}: a training sentence of {longest} tokens is over max_len")
    files = (out / "train.en", out / "train.es")
    for path, get in zip(files, (data.src, data.tgt)):
        pieces = (vocab.sp.id_to_piece(get(i).tolist()) for i in range(len(data)))
        write_lines_atomic(path, (" ".join(p) for p in pieces))
    shutil.copyfile(work / "spm.model", out / "vocab.spm")  # Marian knows it by the suffix
    return files


def format_table(rows: list[dict[str, Any]]) -> str:
    head = "| system | updates | train s | target tok/s | target tokens/update | SacreBLEU |\n"
    head += "|---|---:|---:|---:|---:|---:|\n"
    return head + "".join(
        f"| {r['system']} | {r['updates']:,} | {r['train_s']:.0f} "
        f"| {r['target_tokens_per_s']:,.0f} | {r['target_tokens'] / r['updates']:,.0f} "
        f"| {format(r['sacrebleu'], '.2f') if 'sacrebleu' in r else '-'} |\n"
        for r in rows
    )


# ---------------------------------------------------------------------------------------------
# Running the two systems


def marian_env() -> dict[str, str]:
    """Marian's parallelism is its --cpu-threads workers: one OpenMP/MKL thread each."""
    return thread_env(1)


def train_marian(marian: str, flags: list[str], log: Path, minutes: float | None) -> dict:
    """Run Marian's trainer to the end of ``flags``' budget, or (``minutes``) until its logged
    training time reaches it, then SIGTERM (Marian saves and exits); its log's figures."""
    if minutes is None:
        return read_marian_log(run([marian, *flags], marian_env(), log, "Marian training"))
    lines, seconds, signalled = [], 0.0, False
    with open(log, "w", encoding="utf-8") as f:
        proc = subprocess.Popen(
            [marian, *flags], env=marian_env(), stdout=subprocess.PIPE, text=True,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, errors="replace",
        )  # fmt: skip
        for line in proc.stdout:
            f.write(line)
            lines.append(line)
            m = DISPLAY.search(line)
            seconds += float(m[2]) if m else 0.0
            if seconds >= minutes * 60 and not signalled and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                signalled = True
        rc = proc.wait()
    # after SIGTERM Marian saves its model and exits with 128 + SIGTERM
    if rc and not (signalled and rc in (128 + signal.SIGTERM, -signal.SIGTERM)):
        raise RuntimeError(f"Marian training failed (exit {rc}); its log is {log}")
    return read_marian_log(lines)


def train_ours(work: Path, out: Path, updates: int, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, "-c", OURS_UPDATES, str(work), str(out), str(updates)]
    cmd += [str(args.threads), *(args.set or [])]
    lines = run(cmd, thread_env(args.threads, PYTHONPATH=str(SRC)), out.with_suffix(".log"), "ours")
    return json.loads(lines[-1])


def updates_mode(tmp: Path, work: Path, args: argparse.Namespace) -> list[dict]:
    """Both for ``--updates`` updates, ours, Marian, Marian, ours; per system its runs."""
    from aiayn.demo import demo_train_config

    cfg = demo_train_config(work, tmp / "ours", None, args.set or [], args.updates)
    model = cfg.model_config(len(Vocab.load(work / "spm.model")))
    pairs = export_pairs(work, tmp, model.max_len)
    runs: dict[str, list[dict]] = {"ours": [], "marian": []}
    for i, system in enumerate(("ours", "marian", "marian", "ours")):
        out = tmp / f"{system}{i}"
        if system == "ours":
            runs["ours"].append(train_ours(work, out, args.updates, args))
        else:
            out.mkdir()
            flags = marian_train_args(cfg, model, pairs, tmp / "vocab.spm", out, args.threads)
            flags += ["--after", f"{args.updates}u"]
            runs["marian"].append(train_marian(args.marian, flags, out / "train.log", None))
        done = runs[system][-1]
        rate = done["target_tokens"] / done["train_s"]
        print(f"  {system}: {done['updates']} updates, {rate:,.0f} target tokens/s", flush=True)
    return [summarise("aiayn (ours)", runs["ours"]), summarise(args.marian_name, runs["marian"])]


def summarise(system: str, runs: list[dict]) -> dict:
    """A system's row from its runs: medians of their seconds, tokens and tokens/s."""
    rates = [r["target_tokens"] / r["train_s"] for r in runs]
    return {
        "system": system,
        "updates": runs[0]["updates"],
        "train_s": statistics.median(r["train_s"] for r in runs),
        "target_tokens": statistics.median(r["target_tokens"] for r in runs),
        "target_tokens_per_s": statistics.median(rates),
        "runs_target_tokens_per_s": rates,
    }


def minutes_mode(tmp: Path, work: Path, args: argparse.Namespace) -> list[dict]:
    """Both for ``--minutes`` of training, then each one's last model on the test split."""
    test = test_split(tmp, args.test_limit)
    print(
        f"[1/2] ours: aiayn demo --minutes {args.minutes:g}, its last checkpoint on the test split"
    )
    ours = run_ours(tmp, work, args, test, average=False)
    cfg = load_train_config(tmp / "ours" / "config.json")  # the recipe ours trained with
    vocab = Vocab.load(work / "spm.model")
    model = cfg.model_config(len(vocab))
    print(f"[2/2] {args.marian_name}: the same recipe, data and minutes")
    out = tmp / "marian"
    out.mkdir()
    pairs = export_pairs(work, out, model.max_len)
    flags = marian_train_args(cfg, model, pairs, out / "vocab.spm", out, args.threads)
    theirs = train_marian(args.marian, flags, out / "train.log", args.minutes)
    pieces = vocab.sp.encode(read_lines(test[0]), out_type=str)
    write_lines_atomic(out / "test.en", (" ".join(p) for p in pieces))
    decode = marian_decode_args(
        out / "model.npz", out / "vocab.spm", out / "test.en", out / "hyp.es", args.threads
    )
    run([args.marian, *decode], marian_env(), out / "decode.log", "Marian decoding")
    references = read_lines(test[1])
    rows = []
    for system, row, hyps in (
        ("aiayn (ours)", ours, ours["hypotheses"]["last"]),
        (args.marian_name, theirs, read_lines(out / "hyp.es")),
    ):
        bleu, args.signature = sacre_bleu(hyps, references)
        keep = {k: row[k] for k in ("updates", "train_s", "target_tokens")}
        rate = row["target_tokens"] / row["train_s"]
        rows.append({"system": system, **keep, "target_tokens_per_s": rate, "sacrebleu": bleu})
    args.test_sentences = len(references)
    return rows


def marian_version(marian: str) -> str:
    try:
        done = subprocess.run(
            [marian, "--version"], capture_output=True, text=True, env=marian_env()
        )
    except OSError as e:
        raise UserError(f"--marian {marian}: cannot run it ({e.strerror})") from None
    words = (done.stdout + done.stderr).split()
    if done.returncode or not words or not words[0].startswith("v"):
        raise UserError(f"--marian {marian}: not Marian's trainer (pymarian --version failed)")
    return words[0].lstrip("v")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--marian", help="Marian's trainer: the pymarian command of its venv")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--updates", type=int, help="A-B-B-A for N updates: tokens/s, no BLEU")
    budget.add_argument("--minutes", type=float, help="M minutes each, then test BLEU")
    p.add_argument("--threads", type=int, default=2, help="CPU threads of each system")
    p.add_argument("--test-limit", type=int, help="score the first N test sentences only")
    p.add_argument("--out", default="runs/marian", help="results and the runs")
    p.add_argument("--record", help="write the comparison as a record into this folder")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="a demo recipe variant")
    p.add_argument(
        "--dry-run", action="store_true",
        help="print, as JSON, Marian's training and decoding flags for the demo recipe (and, "
        "with --log, what a Marian log FILE holds); nothing is run or written",
    )  # fmt: skip
    p.add_argument("--log", type=Path, help="--dry-run: a Marian training log to read")
    p.add_argument(
        "--export", type=Path, metavar="WORK",
        help="write the training pairs of the prepared corpus WORK as Marian reads them, and "
        "its vocab.spm, into --out; nothing is trained",
    )  # fmt: skip
    return p.parse_args()


def dry_run(args: argparse.Namespace) -> dict[str, Any]:
    """The Marian side of the comparison as data: what would be run, for a look or a test."""
    from aiayn.data.prepare import BUNDLED_VOCAB_SIZE
    from aiayn.demo import demo_train_config

    w = Path("WORK")
    cfg = demo_train_config(w, w / "ours", args.minutes, args.set or [], args.updates)
    model = cfg.model_config(BUNDLED_VOCAB_SIZE)
    pairs, vocab = (w / "train.en", w / "train.es"), w / "vocab.spm"
    return {
        "train": marian_train_args(cfg, model, pairs, vocab, w / "marian", args.threads),
        "decode": marian_decode_args(w / "model.npz", vocab, w / "test.en", w / "hyp.es", 1),
        "log": read_marian_log(read_lines(args.log)) if args.log else None,
    }


def check(args: argparse.Namespace) -> Path:
    """The arguments of a real run, checked before anything is written; the --out path."""
    if args.updates is None and args.minutes is None:
        raise UserError("give --updates N (tokens/s, A-B-B-A) or --minutes M (and BLEU)")
    if args.updates is not None and args.updates < 1:
        raise UserError(f"--updates must be at least 1, got {args.updates}")
    if args.minutes is not None and not (math.isfinite(args.minutes) and args.minutes > 0):
        raise UserError(f"--minutes must be a positive number, got {args.minutes}")
    if args.threads < 1 or (args.test_limit is not None and args.test_limit < 1):
        raise UserError("--threads and --test-limit must be at least 1")
    out = Path(args.out).resolve()
    check_out(out, BENCHMARK)
    if not args.marian:
        raise UserError("--marian is required: the pymarian command of Marian's venv")
    args.marian_version = marian_version(args.marian)
    args.marian_name = f"Marian {args.marian_version}"
    return out


def main() -> None:
    args = parse_args()
    try:
        if args.dry_run:
            print(json.dumps(dry_run(args), indent=1, ensure_ascii=False))
            return
        if args.export:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            print(*export_pairs(args.export, Path(args.out), 1024 * 1024), sep="\n")
            return
        out = check(args)
    except UserError as e:
        print(f"{BENCHMARK}: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    tmp = temp_dir_beside(out)
    print(f"working in {tmp}")
    work = tmp / "work"
    prepare_bundled(work)
    rows = updates_mode(tmp, work, args) if args.updates else minutes_mode(tmp, work, args)
    table = format_table(rows)
    ratio = rows[0]["target_tokens_per_s"] / rows[1]["target_tokens_per_s"]
    results = {"benchmark": BENCHMARK, "updates": args.updates, "minutes": args.minutes}
    results |= {"threads": args.threads, "ours_over_marian": ratio, "rows": rows}
    results |= {"sacrebleu_signature": getattr(args, "signature", None)}
    write_text_atomic(tmp / "results.json", json.dumps(results, indent=2))
    write_text_atomic(
        tmp / "results.md", f"{budget_words(args)}, {args.threads} thread(s)\n\n{table}"
    )
    publish_dir(tmp, out)
    print(f"\n{table}\nours / Marian target tokens/s {ratio:.2f}x\nwrote {out}/results.json")
    if args.record:
        record(rows, ratio, args)


def budget_words(args: argparse.Namespace) -> str:
    if args.updates:
        return f"{args.updates:,} updates a run, A-B-B-A"
    return f"{args.minutes:g} minutes each"


def record(rows: list[dict[str, Any]], ratio: float, args: argparse.Namespace) -> None:
    """Ours against Marian as a record (``aiayn.records``, topic training), beside the fairseq
    comparison's."""
    from aiayn.records import make_record, write_record

    ours, theirs = rows
    figures: dict[str, float | int | str] = {
        "ours / Marian target tokens/s": f"{ratio:.2f}x",
        "ours target tokens/s": round(ours["target_tokens_per_s"]),
        "Marian target tokens/s": round(theirs["target_tokens_per_s"]),
    }
    if args.minutes:
        figures["SacreBLEU ours / Marian"] = f"{ours['sacrebleu']:.2f} / {theirs['sacrebleu']:.2f}"
        figures["updates ours / Marian"] = f"{ours['updates']:,} / {theirs['updates']:,}"
    per_update = [round(r["target_tokens"] / r["updates"]) for r in rows]
    figures["target tokens an update ours / Marian"] = f"{per_update[0]:,} / {per_update[1]:,}"
    notes = f"--cpu-threads {args.threads} --sync-sgd"
    if args.minutes:
        notes += f"; {args.test_sentences} test sentences, beam {BEAM}, last model of each"
    rec = make_record(
        topic="training",
        what=f"the demo recipe against Marian {args.marian_version}, {budget_words(args)}",
        figures=figures,
        command="benchmarks/demo_vs_marian.py " + " ".join(sys.argv[1:]),
        threads=args.threads,
        peers={"marian": args.marian_version},
        notes=notes,
    )
    print(f"wrote {write_record(rec, args.record)}")


if __name__ == "__main__":
    try:
        main()
    except (RuntimeError, UserError) as e:  # a child failed or gave what we cannot read
        print(f"{BENCHMARK}: {e}", file=sys.stderr)
        raise SystemExit(1) from None
