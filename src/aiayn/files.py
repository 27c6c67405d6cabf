"""Reading lines and writing files: one rule for each, used by every command. Torch-free.

Reading. A line ends at LF ("\\n") only; a CR right before that LF (a Windows CRLF ending) is
removed with it, and a CR anywhere else stays inside the line. Python's text mode splits on a
bare CR too (and ``str.splitlines`` on form feeds and U+2028), which turns one sentence into
two and shifts every later output against its source, so files are read as bytes and split
here. Bytes are decoded as strict UTF-8, line by line, so that an error names the line.

Writing. A file is written to a temporary name beside its destination, fsynced and renamed,
so that a reader (or a crash) sees the old file or the new one, never half of one; a failed
write removes its temporary file. ``publish_dir`` does the same for a whole directory; a
temporary directory is named after its process, and what a killed process left is removed
by the next one made beside the same destination. What is published gets the permissions
the umask gives any new file, whoever wrote it.

Locking. ``exclusive_lock`` holds a file with ``flock``: one process at a time, and the kernel
releases it when the holder ends, however it ends, so a killed run never blocks the next one.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import functools
import gzip
import json
import os
import re
import secrets
import shutil
import socket
import stat
import sys
import tempfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, cast

from .errors import UserError

PathLike = str | os.PathLike


# ----------------------------------------------------------------------------------------
# Reading lines


def open_binary(path: PathLike) -> IO[bytes]:
    """Open ``path`` for reading bytes, decompressing when its name ends in ``.gz``."""
    if Path(path).is_dir():
        raise UserError(f"{path} is a directory, not a text file")
    if str(path).endswith(".gz"):
        return cast(IO[bytes], _Gzip(path, "rb"))  # a GzipFile reads as a binary file does
    return open(path, "rb")


class _Gzip(gzip.GzipFile):
    """A ``.gz`` file whose damage (not gzip, cut short, corrupt) is a ``UserError`` naming
    it, rather than a traceback from inside gzip or zlib."""

    def read(self, size: int | None = -1) -> bytes:
        return self._checked(super().read, size)

    def read1(self, size: int = -1) -> bytes:
        return self._checked(super().read1, size)

    def readline(self, size: int | None = -1) -> bytes:
        return self._checked(super().readline, size)

    def peek(self, n: int) -> bytes:
        return self._checked(super().peek, n)

    def _checked(self, read, size):
        try:
            return read(size)
        except (gzip.BadGzipFile, EOFError, zlib.error) as e:
            raise UserError(f"{self.name}: not a readable gzip file ({e})") from None


def split_lines(stream: Iterable[bytes]) -> Iterator[bytes]:
    """The lines of a byte stream without their endings, by the module's rule.

    Iterating a binary file splits at b"\\n" only (unlike text mode); what is left to do is
    removing the LF and a CR right before it. A last line without LF keeps a trailing CR.
    """
    for raw in stream:
        if raw.endswith(b"\n"):
            raw = raw[:-2] if raw.endswith(b"\r\n") else raw[:-1]
        yield raw


def decode_line(raw: bytes, source: str, lineno: int) -> str:
    """Strict UTF-8 of one line; ``UserError`` naming ``source`` and ``lineno`` if invalid."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(
            f"{source}: line {lineno}: invalid UTF-8 ({e.reason} at byte {e.start})"
        ) from None


@dataclass
class LenientLines:
    """The texts of a stream's lines where a line that is not valid UTF-8 becomes "" and is
    remembered, so that its output line keeps the others aligned and ``check`` names it at
    the end (translation: one output line per input line, whatever the input holds)."""

    name: str
    count: int = 0
    bad: int = 0
    first_bad: list[int] = field(default_factory=list)  # the first 10: memory stays flat

    def texts(self, raw: Iterable[bytes]) -> Iterator[str]:
        for line in raw:
            self.count += 1
            try:
                yield decode_line(line, self.name, self.count)
            except UserError:
                self.bad += 1
                if len(self.first_bad) < 10:
                    self.first_bad.append(self.count)
                yield ""  # an empty line translates to an empty line

    def check(self) -> None:
        """``UserError`` naming the lines that were not valid UTF-8, if any."""
        if self.bad:
            shown = ", ".join(map(str, self.first_bad)) + (", ..." if self.bad > 10 else "")
            raise UserError(
                f"{self.name}: {self.bad} line(s) not valid UTF-8 (line {shown}): their outputs "
                f"are empty lines; the other {self.count - self.bad} were translated"
            )


def iter_lines(source: PathLike | IO[bytes], name: str | None = None) -> Iterator[str]:
    """Lines of a UTF-8 file (``.gz`` read transparently) or an open binary stream, streamed.

    ``name`` is what errors call a stream (default: the path, or ``<stream>``).
    """
    if isinstance(source, (str, os.PathLike)):
        with open_binary(source) as f:
            yield from iter_lines(f, name or str(source))
        return
    for lineno, raw in enumerate(split_lines(source), start=1):
        yield decode_line(raw, name or "<stream>", lineno)


def count_lines(path: PathLike) -> int:
    """How many lines ``split_lines`` finds in the file at ``path``, counted in blocks of bytes
    without decoding (a progress bar's total for a corpus of millions of lines)."""
    count, last = 0, b"\n"
    with open_binary(path) as f:
        while block := f.read(1 << 20):
            count, last = count + block.count(b"\n"), block[-1:]
    return count + (last != b"\n")  # a last line without LF


def read_lines(path: PathLike) -> list[str]:
    """All lines of a UTF-8 text file (``.gz`` allowed), without endings."""
    return list(iter_lines(path))


def read_jsonl(path: PathLike) -> list[dict]:
    """The records of a JSON-lines file (a run's log.jsonl), blank lines skipped; a line that is
    not JSON is a one-line error naming the file and the line."""
    records = []
    for lineno, line in enumerate(iter_lines(path), start=1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                raise UserError(f"{path}: line {lineno}: not JSON") from None
    return records


# ----------------------------------------------------------------------------------------
# Writing atomically


def fsync_dir(path: PathLike) -> None:
    """Make a rename or a new entry in directory ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def check_output_file(path: PathLike) -> Path:
    """Fail early (before hours of decoding) if ``path`` cannot become a file."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{path} is a directory; give a file name for the output")
    check_parent(path)
    return path


def check_parent(path: Path) -> None:
    """Refuse ``path`` when the nearest existing folder above it is a file (``afile/sub``) or
    cannot be written (tried with a nameless temporary file: permissions, a read-only file
    system), before any work, naming the path the user gave."""
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise UserError(f"cannot write {path}: {parent} is a file, not a directory")
    try:
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as err:
        raise UserError(f"cannot write {path}: {parent} is not writable ({err.strerror})") from None


def _same_file(a: Path, b: Path) -> bool:
    """One file under two names: the same path once resolved, or (both existing) the same
    inode, which also catches a hard link."""
    if a.resolve() == b.resolve():
        return True
    try:
        sa, sb = a.stat(), b.stat()
    except OSError:  # one of them does not exist yet
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def check_not_input(
    output: PathLike,
    inputs: Iterable[PathLike | None],
    *,
    option: str = "output",
    whole_dir: bool = False,
) -> None:
    """Refuse an ``output`` that is one of a command's ``inputs`` (the same path, or the same
    file through a symlink or a hard link): writing it would destroy what the command reads.

    ``whole_dir``: ``output`` is a directory the command replaces as a whole, so an input
    inside it is refused too. ``option`` names the output in the message; None inputs are
    skipped (options not given).
    """
    out = Path(output)
    for given in inputs:
        if given is None:
            continue
        source = Path(given)
        if _same_file(out, source):
            raise UserError(f"{option} {out} is the input {source}; choose another path")
        if whole_dir and out.resolve() in source.resolve().parents:
            raise UserError(f"{option} {out} holds the input {source}; choose another path")


@contextmanager
def atomic_file(path: PathLike) -> Iterator[Path]:
    """A fresh temporary path beside ``path``: write it inside the block; on success it is
    fsynced and renamed onto ``path``, on any error it is removed and ``path`` is untouched.

    The temporary name is random and created exclusively, so nothing that exists is reused
    or removed; it keeps the destination's suffix (writers such as matplotlib pick the
    format from it). It is created with the umask's usual permissions, unlike mkstemp's 0600.
    """
    path = check_output_file(path)
    tmp = path.with_name(f".{path.stem}.{secrets.token_hex(4)}.tmp{path.suffix}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "xb"):
            pass
    except OSError as err:  # named for the output asked for, not our hidden file
        raise UserError(f"cannot write {path}: {err.strerror}") from None
    try:
        yield tmp
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_text_atomic(path: PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` so that readers see the old or the new file, never half."""
    with atomic_file(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_lines_atomic(path: PathLike, lines: Iterable[str]) -> None:
    """One string a line, each ended by LF, written atomically."""
    write_text_atomic(path, "".join(line + "\n" for line in lines))


def write_parallel(pairs: Iterable[tuple[str, str]], src_path: PathLike, tgt_path: PathLike) -> int:
    """Two aligned files, a (source, target) pair a line, streamed; returns the number of pairs.

    A newline inside a segment would break the alignment, so it becomes a space (segments are
    also stripped). Both files are written under temporary names and renamed only once both
    are complete, so an interrupted run never leaves a truncated pair that looks finished.
    """
    n = 0
    with atomic_file(src_path) as tmp_src, atomic_file(tgt_path) as tmp_tgt:
        with open(tmp_src, "w", encoding="utf-8") as fs, open(tmp_tgt, "w", encoding="utf-8") as ft:
            for src, tgt in pairs:
                fs.write(" ".join(src.split("\n")).strip() + "\n")
                ft.write(" ".join(tgt.split("\n")).strip() + "\n")
                n += 1
    return n


def temp_dir_beside(path: PathLike) -> Path:
    """A new, empty directory beside ``path`` (same file system, so renaming it is atomic).

    Named ``.NAME.PID-HOST-RANDOM.tmp`` after its process, so that what a killed process
    left beside ``path`` is recognised and removed here, the next time (``remove_leftovers``).
    Created with the umask's usual permissions (unlike mkdtemp's 0700): it becomes the output.
    """
    path = Path(path)
    check_parent(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_leftovers(path.parent, path.name)
        while True:
            tmp = path.with_name(f".{path.name}.{os.getpid()}-{_HOST}-{secrets.token_hex(4)}.tmp")
            try:
                tmp.mkdir()
                return tmp
            except FileExistsError:
                continue
    except PermissionError as err:  # named for the output asked for, not our hidden folder
        raise UserError(
            f"{path}: cannot write it: {path.parent} is not writable ({err.strerror})"
        ) from None


_HOST = f"{zlib.crc32(socket.gethostname().encode()):08x}"  # a pid means something on one host
_LEFTOVER = re.compile(r"\.(?P<name>.+)\.(?P<pid>\d+)-(?P<host>[0-9a-f]{8})-[0-9a-f]{8}\.tmp")


def remove_leftovers(directory: PathLike, name: str | None = None) -> None:
    """Remove the directories ``temp_dir_beside`` made in ``directory`` (for ``name`` only, if
    given) whose process, on this host, has ended. One that may hold the only copy of its
    destination (``publish_dir``'s fallback moved it there, then the process died) is kept."""
    directory = Path(directory)
    for entry in directory.iterdir() if directory.is_dir() else []:
        found = _LEFTOVER.fullmatch(entry.name)
        if found is None or found["host"] != _HOST or name not in (None, found["name"]):
            continue
        if entry.is_symlink() or not entry.is_dir() or _alive(int(found["pid"])):
            continue
        dest = found["name"]
        if (entry / dest).exists() and not (directory / dest).exists():
            continue
        shutil.rmtree(entry, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):  # another user's process; not a pid at all
        return True
    return True


def _umask() -> int:
    """The process umask; reading it means setting it, so 0o077 stands in for that instant."""
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def apply_umask(directory: Path) -> None:
    """Give ``directory`` and everything in it the permissions the umask gives new files and
    folders: some writers (safetensors) create private 0600 files of their own accord."""
    mask = _umask()
    for root, _, files in os.walk(directory):
        os.chmod(root, 0o777 & ~mask)
        for name in files:
            if not os.path.islink(os.path.join(root, name)):
                os.chmod(os.path.join(root, name), 0o666 & ~mask)


def fsync_tree(directory: Path) -> None:
    """fsync every file directly in ``directory``, then the directory itself."""
    for file in directory.iterdir():
        if file.is_file():
            with open(file, "rb") as f:
                os.fsync(f.fileno())
    fsync_dir(directory)


def publish_dir(tmp: Path, final: Path) -> None:
    """Rename the complete directory ``tmp`` to ``final``, so that a crash leaves the old or
    the new directory there, never neither. An existing ``final`` (which the caller has
    decided may be replaced) is swapped with ``tmp`` in one step where the OS can (Linux
    ``renameat2``), else first moved aside; the old copy is removed only afterwards."""
    apply_umask(tmp)
    if final.is_dir() and not final.is_symlink():  # a replaced directory keeps its permissions
        os.chmod(tmp, stat.S_IMODE(final.stat().st_mode))
    fsync_tree(tmp)
    if not (final.exists() or final.is_symlink()):
        os.rename(tmp, final)
        fsync_dir(final.parent)
        return
    if _exchange(tmp, final):
        old = tmp  # now holds the previous ``final``
    else:  # a crash between these two renames leaves the old copy inside ``old``
        old = temp_dir_beside(final)
        os.rename(final, old / final.name)
        os.rename(tmp, final)
    fsync_dir(final.parent)
    if old.is_symlink() or not old.is_dir():
        old.unlink()
    else:
        shutil.rmtree(old)


_AT_FDCWD, _RENAME_EXCHANGE = -100, 2  # from <fcntl.h> and <linux/fs.h>


@functools.cache
def _renameat2() -> Callable[..., int] | None:
    """glibc's (2.28+) renameat2, or None on other systems."""
    if sys.platform != "linux":
        return None
    function = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if function is not None:
        function.argtypes = [ctypes.c_int, ctypes.c_char_p] * 2 + [ctypes.c_uint]
        function.restype = ctypes.c_int
    return function


def _exchange(a: Path, b: Path) -> bool:
    """Swap the entries ``a`` and ``b`` atomically; False where the C library, the kernel
    (before Linux 3.15) or the file system cannot."""
    renameat2 = _renameat2()
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


# ----------------------------------------------------------------------------------------
# Locking


@contextmanager
def exclusive_lock(path: PathLike, *, wait: bool = True) -> Iterator[bool]:
    """Hold ``path`` exclusively (created if missing) and write this process's pid into it.

    ``flock``: the kernel releases the lock when the process ends, even by SIGKILL. ``wait``
    False: do not wait for another holder; yields whether this process got the lock (see
    ``lock_holder`` for who has it otherwise).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield True
    finally:
        os.close(fd)  # closing releases the lock


def lock_holder(path: PathLike) -> int | None:
    """The pid ``exclusive_lock`` wrote into ``path``; None before the holder has written it."""
    try:
        text = Path(path).read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
