"""SHA-256 digests of a checkpoint's files, recorded at save and checked at load. Torch-free.

safetensors and ``torch.save`` files carry no checksum: bytes flipped inside a tensor (a bad
disk, a copy cut short and patched, a bit rot) load without a word and change every output.
A save writes ``SHA256SUMS`` beside the files, in ``sha256sum``'s own format (so
``sha256sum -c SHA256SUMS`` checks a copy by hand); a load compares the file it reads with its
line there and names a damaged file in one line. A directory without ``SHA256SUMS`` (saved
before digests were recorded, or averaged) loads as before, unchecked.

Hashing reads the file once more; it sits in the page cache after the save or before the load
(``benchmarks/digest_cost.py`` measures it against the read).
"""

from __future__ import annotations

import hashlib
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


def recorded_digest(path: Path) -> str | None:
    """The digest ``SHA256SUMS`` beside ``path`` records for it, None when none is recorded."""
    sums = path.parent / DIGESTS
    if not sums.is_file():
        return None
    for line in sums.read_text(encoding="utf-8", errors="replace").splitlines():
        digest, _, name = line.partition("  ")
        if name == path.name:
            return digest
    return None


def check_digest(path: Path) -> None:
    """``UserError`` when ``path`` is not the file whose digest was recorded at save."""
    expected = recorded_digest(path)
    if expected is not None and file_sha256(path) != expected:
        raise UserError(
            f"{path}: its SHA-256 is not the one {DIGESTS} recorded when it was saved: the file "
            "is damaged; use another checkpoint (or a copy of this one)"
        )
