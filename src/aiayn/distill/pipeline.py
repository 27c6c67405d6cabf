"""``aiayn distill``: a small, fast student from a teacher, in one command (sequence-level
knowledge distillation, Kim and Rush 2016), built on the pieces the other commands use:

1. the teacher (a checkpoint, an ensemble of them, or an imported model) translates the
   training sources with the paper's beam (``aiayn.Translator``), in chunks a kill does not
   lose (``distill.teacher``);
2. of each source's n-best, the teacher's best or the best by sentence chrF or BLEU against
   the reference, then the filter on the teacher's own scores (``distill.corpus``);
3. the distilled pairs prepared with the teacher's vocabulary (``data.prepare``), and the
   vocabulary shortlist of them (``data.lexical``);
4. the student trained (the demo's recipe with a student preset, ``config.PRESETS``) and its
   last checkpoints averaged as the demo averages them (``demo.average_run``);
5. teacher and student decode the test split side by side: SacreBLEU and chrF with their
   intervals, the paired tests and the interval of the difference; then decoding speed in
   fp32 and int8, with and without the shortlist, on one thread and two (``distill.speed``),
   and the size on disk, as records (``aiayn.records``) and ``OUT/report.json``.

Running the same command again continues: the teacher's finished chunks, the prepared data and
the student's checkpoints are reused. Everything is written under OUT.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..checkpoint import follow_pointer
from ..data import prepare_corpus
from ..data.binarize import TokenDataset, held_out_text, read_meta
from ..data.lexical import build_shortlist, shortlist_text
from ..data.pieces import load_vocabulary
from ..demo import TrainingStopped, average_run, demo_train_config
from ..errors import UserError
from ..files import check_not_input, read_lines, write_parallel, write_text_atomic
from ..records import RECORDS
from ..translator import Translator
from ..workflow import train_model
from .corpus import SELECT, Filter, distil
from .report import side_by_side, write_records
from .teacher import CHUNK, read_nbest, translate_resumable

MARKER = ".aiayn-distill"  # written into the OUT it creates: a later run may continue there
SPEED_SENTENCES = 200  # the test sentences each form of the speed grid decodes


@dataclass(frozen=True)
class Budget:
    """What bounds the run's cost: the student's updates (default: the demo's) or minutes, the
    training pairs the teacher translates, the test sentences evaluated (None: all) and the
    test sentences each form of the speed grid decodes."""

    student_updates: int | None = None
    minutes: float | None = None
    teacher_limit: int | None = None
    test_limit: int | None = None
    speed_limit: int = SPEED_SENTENCES

    def __post_init__(self) -> None:
        for name in ("student_updates", "teacher_limit", "test_limit", "speed_limit"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise UserError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
        if self.student_updates is not None and self.minutes is not None:
            raise UserError("give --student-updates or --minutes, not both")


@dataclass(frozen=True)
class Teaching:
    """How the teacher makes the corpus: the beam (None: the paper's 4), the n-best it keeps,
    which of them is chosen (``corpus.SELECT``), the filter, and its decoding processes."""

    beam: int | None = None
    nbest: int = 1
    select: str = "model"
    keep: Filter = field(default_factory=Filter)
    workers: int | str = "auto"
    chunk: int = CHUNK

    def __post_init__(self) -> None:
        if self.select not in SELECT:
            raise UserError(f"--select must be one of {', '.join(SELECT)}, not {self.select!r}")
        if self.select != "model" and self.nbest < 2:
            raise UserError(
                f"--select {self.select} chooses among the n-best: give --nbest 2 or more"
            )


def run_distill(
    teachers: Sequence[str | Path],
    data: str | Path,
    out: str | Path,
    *,
    student: str = "student-demo",
    sets: Sequence[str] = (),
    budget: Budget = Budget(),
    teaching: Teaching = Teaching(),
    record: Path | None = None,
    command: str = "aiayn distill",
    progress: Callable[[str], Any] = print,
    bars: bool = False,
) -> dict[str, Any]:
    """Every step of the module's docstring, into ``out``; returns the report (also written
    to ``out/report.json``) and writes its records into ``record`` (default ``out/records``).
    ``bars``: progress bars on stderr."""
    started = time.monotonic()
    data, out = Path(data).resolve(), Path(out).resolve()
    given, models = list(teachers), [follow_pointer(t).resolve() for t in teachers]
    cfg = demo_train_config(
        out / "data",
        out / "student",
        budget.minutes,
        [f"preset={student}", *sets],
        budget.student_updates,
    )  # a bad --set or preset fails before any decoding
    meta = read_meta(data)
    held_out = {split: held_out_files(data, split) for split in ("valid", "test")}
    check_not_input(out, [data, *models], option="--out", whole_dir=True)
    _start_run_dir(out)

    progress("[1/6] the teacher translates the training sources")
    sources, references = training_text(data, budget.teacher_limit)
    nbest = _teacher_nbest(models, sources, out, teaching, bars)

    progress("[2/6] choosing and filtering the teacher's outputs")
    pairs, counts = distil(sources, references, nbest, teaching.select, teaching.keep)
    write_parallel(pairs, out / "distilled.src", out / "distilled.tgt")
    progress(f"      kept {counts['kept']:,} of {counts['read']:,} pairs: {json.dumps(counts)}")

    progress("[3/6] preparing the distilled corpus with the teacher's vocabulary")
    dataset = _prepare(out, models[0], held_out, meta.get("record", {}), bars)
    shortlist = _shortlist(dataset, out / "shortlist.json", bars)

    progress(
        f"[4/6] training the {student} student ({cfg.max_updates or cfg.max_minutes} "
        f"{'updates' if cfg.max_updates else 'minutes'}), then averaging"
    )
    trained = train_model(dataclasses.asdict(cfg))
    if trained.stopped is not None:
        summary = trained.summary
        raise TrainingStopped(trained.stopped, summary["updates"], summary.get("checkpoint"))
    averaged, k, _ = average_run(out / "student", *_read_pair(held_out["valid"]), progress)

    progress("[5/6] teacher and student on the test split, then the speed of each form")
    sides: dict[str, Sequence[Path]] = {"teacher": models, "student": [averaged]}
    test = _limited(_read_pair(held_out["test"]), budget.test_limit)
    lang = meta.get("record", {}).get("tgt_lang")
    report = side_by_side(
        sides, test, out, shortlist, lang=lang, speed=budget.speed_limit, bars=bars
    )

    progress("[6/6] the report and its records")
    report |= {
        "teachers": [str(t) for t in models],
        "teacher_label": " + ".join(str(t) for t in given),
        "student": {"preset": student, "averaged": str(averaged), "averaged_checkpoints": k},
        "distilled": counts,
        "training": trained.summary,
        "command": command,
        "end_to_end_s": time.monotonic() - started,
    }
    report["records"] = [str(p) for p in write_records(report, record or out / RECORDS)]
    write_text_atomic(out / "report.json", json.dumps(report, indent=2, ensure_ascii=False))
    return report


def training_text(data: Path, limit: int | None = None) -> tuple[list[str], list[str]]:
    """The first ``limit`` training pairs of the prepared dataset ``data`` as text, read back
    from their ids with the dataset's vocabulary: the pairs training saw, after cleaning
    and without the held-out ones (a piece the vocabulary lacked reads as its unknown)."""
    vocab, train = load_vocabulary(data), TokenDataset(data, "train")
    n = len(train) if limit is None else min(limit, len(train))
    sources = [vocab.decode(train.src(i).tolist()) for i in range(n)]
    return sources, [vocab.decode(train.tgt(i).tolist()) for i in range(n)]


def held_out_files(data: Path, split: str) -> tuple[Path, Path]:
    """The source and reference text of the dataset's held-out ``split`` (``aiayn prepare``
    keeps them beside the ids), or a one-line error naming what is missing."""
    src, ref = (data / name for name in held_out_text(split))
    for path in (src, ref):
        if not path.is_file():
            raise UserError(
                f"--data {data}: no {path.name}; the student needs the dataset's {split} split "
                "(aiayn prepare with --valid-src/--test-src, or --valid-size/--test-size)"
            )
    return src, ref


def _read_pair(files: tuple[Path, Path]) -> tuple[list[str], list[str]]:
    return read_lines(files[0]), read_lines(files[1])


def _limited(pair: tuple[list[str], list[str]], n: int | None) -> tuple[list[str], list[str]]:
    return (pair[0][:n], pair[1][:n]) if n is not None else pair


def _start_run_dir(out: Path) -> None:
    """``out`` made (with the marker), or one a run of this command made: nothing else."""
    if out.exists() and not (out / MARKER).is_file():
        if not out.is_dir() or any(out.iterdir()):
            raise UserError(f"--out {out} exists and aiayn distill did not make it; choose another")
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / MARKER, "made by aiayn distill, which continues a run here\n")


def _teacher_nbest(
    teachers: list[Path], sources: list[str], out: Path, teaching: Teaching, bars: bool
) -> list[list[dict[str, Any]]]:
    """Each source's n-best by the teacher, resumed from the chunks on disk."""
    with Translator(teachers, workers=teaching.workers, precision="fp32") as translator:
        request = translator.request(beam=teaching.beam, nbest=teaching.nbest)
        settings = {
            "teachers": [str(t) for t in teachers],
            "search": dataclasses.asdict(request.decode),
        }
        path = translate_resumable(
            translator,
            sources,
            out / "teacher.jsonl",
            request,
            settings=settings,
            chunk=teaching.chunk,
            progress=bars,
        )
    return read_nbest(path)


def _prepare(
    out: Path,
    vocab: Path,
    held_out: dict[str, tuple[Path, Path]],
    record: dict[str, Any],
    bars: bool,
) -> Path:
    """``out/data``: the distilled pairs and the held-out splits, with the teacher's
    vocabulary; reused when it was prepared from these very pairs."""
    files = (out / "distilled.src", out / "distilled.tgt")
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in files)).hexdigest()
    dataset = out / "data"
    if (dataset / "meta.json").is_file():
        if read_meta(dataset).get("record", {}).get("distilled_sha256") == digest:
            return dataset
    splits: dict[str, Any] = {"train": files, **held_out}
    languages = {k: v for k, v in record.items() if k in ("src_lang", "tgt_lang")}
    prepare_corpus(
        splits,
        dataset,
        vocab=vocab,
        record={**languages, "distilled_sha256": digest},
        progress=bars,
    )
    return dataset


def _shortlist(dataset: Path, path: Path, bars: bool) -> Path:
    """The shortlist of the distilled corpus (``aiayn shortlist``): teacher and student share
    its vocabulary, so one list serves both."""
    write_text_atomic(path, shortlist_text(build_shortlist(dataset, progress=bars)))
    return path
