"""Results as records: every measured figure is one JSON file, and the tables are rendered from them.

A figure typed by hand into prose goes stale and loses the machine it was measured on; a record
keeps the figure with its command, commit, date, machine class, CPU, threads and the versions of
torch and the peers it was measured against. Records live in one place, ``records/`` at the
repository root, one file each; ``python -m aiayn.records render`` rewrites every marked block
of README.md and docs/*.md from them, and a lint test fails when a committed table differs from
a fresh render. Torch-free: the versions are read from the installed packages' metadata.

    record = make_record(topic="demo", what="aiayn demo, 2,200 updates", command="make demo",
                         figures={"SacreBLEU": 22.6, "minutes": 20.8})
    write_record(record, "records")          # records/demo-2026-12-05T013000-1a2b3c.json
    python -m aiayn.records render           # README.md and docs/*.md, from records/

A block is ``<!-- results:TOPIC -->`` ... ``<!-- /results -->`` (one topic's table, for a docs
page) or ``<!-- results:headline -->`` (the README's: one row for each headline record).
A table shows, for each thing measured (``what``) on each machine class, its newest record:
an older one is history, kept in ``records/`` and in git, not shown.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import secrets
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from .errors import UserError
from .files import write_text_atomic
from .runtime.cpu import REPORTED_FLAGS, cpu_class, cpu_model_and_flags

RECORDS = "records"  # the one directory of records, at the repository root
# what a record measures; each topic has one table, on the page that explains it
PAGES = {
    "demo": "docs/demo.md#measured",
    "training": "docs/benchmarks.md#training",
    "decoding": "docs/benchmarks.md#decoding",
    "search_rules": "docs/decoding.md#search-rules-of-other-toolkits",
    "export": "docs/export.md#measured",
    "serving": "docs/serving.md#measured",
    "parsing": "docs/parsing.md#measured",
    "experiments": "docs/experiments.md#measured",
    "data": "docs/benchmarks.md#data",
    "distill": "docs/distill.md#measured",
    "import": "docs/import.md#measured",
}
TOPICS = tuple(PAGES)
# the chip classes of aiayn.runtime.hardware.Bf16.chip, which aiayn.runtime.figures keys its figures by
CLASSES = ("cpu-amx", "cpu-avx512_bf16", "cpu-no_bf16", "cuda")
HEADLINE = "headline"
HEADLINE_FIGURES = 3  # a README row shows a record's first three figures; its page shows all
BLOCK = re.compile(r"(<!-- results:([\w-]+) -->\n)(.*?)(<!-- /results -->)", re.DOTALL)


@dataclass(frozen=True)
class Record:
    """One measurement: what was measured, its figures, and what is needed to measure it again.

    ``figures`` maps a label to a number or a short string ("0.98-1.02x"); the first is the
    headline figure, printed in bold. ``date`` is ISO 8601 (a date, or a date and time).
    ``commit`` is "unknown" where the measurement did not record it. ``headline`` puts the record
    in the README's table (the newest of each ``what`` and class).
    """

    topic: str
    what: str
    figures: dict[str, float | int | str]
    command: str
    commit: str
    date: str
    machine_class: str
    cpu: str
    flags: str
    threads: int
    torch: str
    peers: dict[str, str] = field(default_factory=dict)
    notes: str = ""
    headline: bool = False


_TYPES = {
    "topic": str,
    "what": str,
    "figures": dict,
    "command": str,
    "commit": str,
    "date": str,
    "machine_class": str,
    "cpu": str,
    "flags": str,
    "threads": int,
    "torch": str,
    "peers": dict,
    "notes": str,
    "headline": bool,
}
_OPTIONAL = {"peers", "notes", "headline"}  # the keys with a default


def check(data: Any, source: str) -> Record:
    """The record in ``data`` (a JSON object read from ``source``), or a one-line UserError
    naming ``source`` and the key at fault."""
    if not isinstance(data, dict):
        raise UserError(f"{source}: a record is a JSON object, not {type(data).__name__}")
    for key in data:
        if key not in _TYPES:
            raise UserError(f"{source}: unknown key {key!r} (keys: {', '.join(_TYPES)})")
    for key, kind in _TYPES.items():
        if key not in data:
            if key in _OPTIONAL:
                continue
            raise UserError(f"{source}: missing key {key!r}")
        value = data[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise UserError(f"{source}: {key} must be {kind.__name__}, not {value!r}")
    _check_values(data, source)
    return Record(**data)


def _check_values(data: dict[str, Any], source: str) -> None:
    if data["topic"] not in TOPICS:
        raise UserError(f"{source}: topic {data['topic']!r} is not one of {', '.join(TOPICS)}")
    if data["machine_class"] not in CLASSES:
        known = ", ".join(CLASSES)
        raise UserError(f"{source}: machine_class {data['machine_class']!r} is not one of {known}")
    if not data["figures"]:
        raise UserError(f"{source}: figures is empty; a record holds at least one figure")
    for name, value in data["figures"].items():
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise UserError(f"{source}: figures[{name!r}] must be a number or a string")
        if isinstance(value, float) and not math.isfinite(value):  # json reads NaN, Infinity
            raise UserError(f"{source}: figures[{name!r}] is {value}, not a measured number")
    for name, version in data.get("peers", {}).items():
        if not isinstance(version, str):
            raise UserError(f"{source}: peers[{name!r}] must be a version string")
    try:
        datetime.fromisoformat(data["date"])
    except ValueError:
        raise UserError(f"{source}: date {data['date']!r} is not ISO 8601") from None
    if data["threads"] < 1:
        raise UserError(f"{source}: threads must be at least 1, not {data['threads']}")


def load_records(directory: str | os.PathLike[str] = RECORDS) -> list[Record]:
    """Every ``*.json`` record in ``directory``, checked, oldest first (then by file name)."""
    records = []
    for path in sorted(Path(directory).glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as e:
            raise UserError(f"{path}: not UTF-8 text (byte {e.start}); a record is JSON") from None
        except json.JSONDecodeError as e:
            raise UserError(f"{path}:{e.lineno}: not JSON ({e.msg})") from None
        records.append(check(data, str(path)))
    return sorted(records, key=lambda r: _when(r))


def _when(record: Record) -> datetime:
    when = datetime.fromisoformat(record.date)
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def write_record(record: Record, directory: str | os.PathLike[str] = RECORDS) -> Path:
    """Write ``record`` as a new file in ``directory`` (atomically, under a name no other record
    has) and return its path; nothing that exists is overwritten."""
    check(asdict(record), "the record")  # a bad record fails before a file exists
    stamp = _when(record).strftime("%Y-%m-%dT%H%M%S")
    path = Path(directory) / f"{record.topic}-{stamp}-{secrets.token_hex(3)}.json"
    if path.exists():  # six random hex digits collide once in millions: say so, never overwrite
        raise UserError(f"{path} exists; write the record again")
    write_text_atomic(path, json.dumps(asdict(record), indent=2, ensure_ascii=False) + "\n")
    return path


def make_record(
    *,
    topic: str,
    what: str,
    figures: dict[str, float | int | str],
    command: str,
    threads: int | None = None,
    machine_class: str | None = None,
    peers: dict[str, str] | None = None,
    notes: str = "",
    headline: bool = False,
) -> Record:
    """A record of a measurement made now, on this machine, by this checkout: the commit, the
    date, the CPU and its flags, the class, the threads and torch's version are filled in."""
    model, flags = cpu_model_and_flags()
    record = Record(
        topic=topic,
        what=what,
        figures=dict(figures),
        command=command,
        commit=current_commit(),
        date=datetime.now(UTC).isoformat(timespec="seconds"),
        machine_class=machine_class or cpu_class(flags),
        cpu=model,
        flags=" ".join(f for f in REPORTED_FLAGS if f in flags),
        threads=threads or os.cpu_count() or 1,
        torch=package_version("torch"),
        peers=dict(peers or {}),
        notes=notes,
        headline=headline,
    )
    return check(asdict(record), f"the record of {what!r}")


def current_commit() -> str:
    """The checkout's short commit, "+" when it has uncommitted changes; "unknown" outside git."""
    here = Path(__file__).resolve().parent
    try:
        head = _git(here, "rev-parse", "--short", "HEAD")
        dirty = _git(here, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+" if dirty else "")


def _git(cwd: Path, *args: str) -> str:
    run = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True)
    return run.stdout.strip()


def package_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "none"


# --- rendering -------------------------------------------------------------------------------


def current(records: list[Record]) -> list[Record]:
    """For each thing measured on each class, its newest record; newest first."""
    newest: dict[tuple[str, str, str], Record] = {}
    for record in records:  # oldest first: a later one replaces an earlier
        newest[(record.topic, record.what, record.machine_class)] = record
    return sorted(newest.values(), key=_when, reverse=True)


def format_figure(value: float | int | str) -> str:
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def format_figures(figures: dict[str, float | int | str]) -> str:
    """``SacreBLEU **22.59**, updates 2,200``: the first figure in bold."""
    parts = []
    for i, (name, value) in enumerate(figures.items()):
        text = format_figure(value)
        parts.append(f"{name} **{text}**" if i == 0 else f"{name} {text}")
    return ", ".join(parts)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _machines(records: list[Record]) -> str:
    """Each class's machine named once: ``cpu-no_bf16: AMD EPYC (flags: avx2)``."""
    seen: dict[str, set[str]] = {}
    for record in records:
        seen.setdefault(record.machine_class, set()).add(f"{record.cpu} (flags: {record.flags})")
    named = [f"`{cls}`: {'; '.join(sorted(cpus))}" for cls, cpus in sorted(seen.items())]
    return "Machines: " + "; ".join(named) + "."


def render_topic(records: list[Record], topic: str) -> str:
    """One topic's table for its docs page: every current record, newest first."""
    rows = [r for r in current(records) if r.topic == topic]
    if not rows:
        return "No record yet.\n"
    lines = [
        "| what | result | class | threads | date | commit | command | conditions |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [r.what, format_figures(r.figures), f"`{r.machine_class}`", str(r.threads)]
        cells += [r.date[:10], r.commit, f"`{r.command}`", r.notes]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n\n" + _machines(rows) + "\n"


def render_headline(records: list[Record]) -> str:
    """The README's table: each current headline record in the order of TOPICS, one row each."""
    rows = [r for r in current(records) if r.headline]
    rows.sort(key=lambda r: TOPICS.index(r.topic))
    if not rows:
        return "No record yet.\n"
    lines = ["| what | result | class | date | details |", "|---|---|---|---|---|"]
    for r in rows:
        page = PAGES[r.topic]
        name = Path(page.partition("#")[0]).stem
        link = f"[{name}]({page})"
        figures = dict(list(r.figures.items())[:HEADLINE_FIGURES])
        cells = [r.what, format_figures(figures), f"`{r.machine_class}`", r.date[:10], link]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n\n" + _machines(rows) + "\n"


def render_block(records: list[Record], name: str, source: str) -> str:
    if name == HEADLINE:
        return render_headline(records)
    if name not in TOPICS:
        raise UserError(f"{source}: results:{name} names no topic (topics: {', '.join(TOPICS)})")
    return render_topic(records, name)


def render_text(text: str, records: list[Record], source: str) -> str:
    """``text`` with every marked block's body replaced by a fresh render."""

    def replace(match: re.Match[str]) -> str:
        body = render_block(records, match.group(2), source)
        return match.group(1) + body + match.group(4)

    return BLOCK.sub(replace, text)


def rendered_pages(root: Path) -> list[Path]:
    """The pages that may hold results blocks: README.md and docs/**/*.md."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def render(root: Path, *, write: bool = True) -> list[Path]:
    """Re-render every block under ``root`` from ``root/records``; return the pages that
    changed (written only when ``write``)."""
    records = load_records(root / RECORDS)
    changed = []
    for page in rendered_pages(root):
        if not page.is_file():
            continue
        try:
            text = page.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise UserError(f"{page}: not UTF-8 text (byte {e.start})") from None
        new = render_text(text, records, str(page.relative_to(root)))
        if new != text:
            changed.append(page)
            if write:
                write_text_atomic(page, new)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m aiayn.records", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "render", help="rewrite the results blocks of README.md and docs/ from records/"
    )
    p.add_argument("--root", default=".", help="the repository root (default: here)")
    p.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if a page would change"
    )
    args = parser.parse_args(argv)
    root = Path(args.root)
    try:
        changed = render(root, write=not args.check)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for page in changed:
        print(f"{'out of date' if args.check else 'rendered'}: {page.relative_to(root)}")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
