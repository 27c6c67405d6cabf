"""SHA-256 digests of a checkpoint's files, recorded at save and checked at load. Torch-free.

safetensors and ``torch.save`` files carry no checksum: bytes flipped inside a tensor (a bad
disk, a copy cut short and patched, a bit rot) load without a word and change every output.
A save writes ``SHA256SUMS`` beside the files, in ``sha256sum``'s own format (so
``sha256sum -c SHA256SUMS`` checks a copy by hand); a load compares the file it reads with its
line there and names a damaged file (or a damaged ``SHA256SUMS``) in one line. A directory
without ``SHA256SUMS`` (saved before digests were recorded) loads as before, unchecked.

Hashing reads the file once more; it sits in the page cache after the save or before the load
(``benchmarks/digest_cost.py`` measures it against the read).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from ..errors import UserError

DIGESTS = "SHA256SUMS"


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def write_digests(directory: Path, names: list[str]) -> None:
    """``directory/SHA256SUMS`` for those of ``names`` that exist there."""
    lines = [
        f"{file_sha256(directory / name)}  {name}\n"
        for name in names
        if (directory / name).is_file()
    ]
    (directory / DIGESTS).write_text("".join(lines), encoding="utf-8")


_LINE = re.compile(r"([0-9a-fA-F]{64}) [ *](.+)")  # sha256sum's line, text or binary mode


def recorded_digest(path: Path) -> str | None:
    """The digest ``SHA256SUMS`` beside ``path`` records for it, None when none is recorded.
    A ``SHA256SUMS`` that is not ``sha256sum``'s format is a UserError, not a check silently
    skipped."""
    sums = path.parent / DIGESTS
    if not sums.is_file():
        return None
    try:
        lines = sums.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        lines = ["\ufffd"]  # not text: named below as its first line
    for number, line in enumerate(lines, 1):
        found = _LINE.fullmatch(line)
        if found is None:
            raise UserError(
                f"{sums}: line {number} is not a sha256sum line (64 hex digits, two spaces, a "
                "file name): the checkpoint's digests are damaged; use another checkpoint (or "
                "a copy of this one)"
            )
        if found.group(2) == path.name:
            return found.group(1).lower()
    return None


def check_digest(path: Path) -> None:
    """``UserError`` when ``path`` is not the file whose digest was recorded at save."""
    expected = recorded_digest(path)
    if expected is not None and file_sha256(path) != expected:
        raise UserError(
            f"{path}: its SHA-256 is not the one {DIGESTS} recorded when it was saved: the file "
            f"or {DIGESTS} is damaged (`sha256sum -c {DIGESTS}` in the checkpoint shows "
            "which changed); use another checkpoint (or a copy of this one)"
        )
