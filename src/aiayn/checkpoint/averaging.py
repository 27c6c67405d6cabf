"""Checkpoint averaging (section 6.1): the mean of several checkpoints' weights, written as a
checkpoint directory of its own, and the choice of which to average (the last k, the best k by
validation, their moving averages, or the k of the last whose average scores best).
"""

from __future__ import annotations

import json
import math
import shutil
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from safetensors.torch import save_file

from ..data.moses_bpe import BPE_FILES
from ..data.pieces import PAIR_FILES, copy_vocabulary, vocabulary_file
from ..errors import UserError
from ..files import check_not_input, publish_dir, temp_dir_beside
from . import (
    EMA_DIR,
    LOWER_IS_BETTER,
    META,
    VOCAB,
    WEIGHTS,
    list_checkpoints,
    load_state,
    read_meta,
    vocab_fingerprint,
)
from .digest import DIGESTS, write_digests


def is_averaged_checkpoint(path: Path) -> bool:
    """Whether ``path`` is a directory ``average_checkpoints`` wrote, holding nothing else."""
    if path.is_symlink() or not path.is_dir():
        return False
    if any(
        p.name not in (WEIGHTS, META, VOCAB, DIGESTS, *PAIR_FILES, *BPE_FILES)
        for p in path.iterdir()
    ):
        return False
    try:
        return "averaged_from" in read_meta(path)
    except ValueError:
        return False


def check_average_out(out: Path, inputs: Sequence[Path], force: bool = False) -> None:
    """Refuse an output directory whose replacement would destroy what averaging did not write.

    Never one of the inputs (the checkpoints, the validation files) or a directory that holds
    one (a run or checkpoints directory), even with ``force``; an existing path only if it is
    a previous averaged checkpoint, or with ``force``.
    """
    check_not_input(out, inputs, option="--out", whole_dir=True)
    if (out.exists() or out.is_symlink()) and not force and not is_averaged_checkpoint(out):
        raise UserError(
            f"--out {out} exists and is not an averaged checkpoint; choose a new directory, "
            "or pass --force to replace it"
        )


def check_same_model(paths: Sequence[Path]) -> None:
    """Averaging weights means something only for one model config and one vocabulary."""
    first, first_meta = Path(paths[0]), read_meta(Path(paths[0]))
    first_vocab = vocab_fingerprint(first)
    for p in paths[1:]:
        meta = read_meta(Path(p))
        if meta.get("model_config") != first_meta.get("model_config"):
            raise UserError(f"{p} and {first} have different model configs: cannot average them")
        if vocab_fingerprint(Path(p)) != first_vocab:
            raise UserError(
                f"{p} and {first} have different vocabularies ({VOCAB}): cannot average them"
            )


def check_same_tensors(
    first: Path, reference: dict[str, torch.Tensor], path: Path, state: dict[str, torch.Tensor]
) -> None:
    """``state`` (of ``path``) holds ``reference``'s (of ``first``) tensor names with the same
    shapes and dtypes.

    A shape that differs would broadcast in the sum (a [1, d] tensor into a [d_ff, d] one)
    and give an average that loads and translates garbage; a dtype that differs leaves no
    one dtype to store the average in.
    """
    if missing := sorted(reference.keys() - state.keys()):
        raise UserError(f"{path} has no tensor {missing[0]}, which {first} has: cannot average")
    if extra := sorted(state.keys() - reference.keys()):
        raise UserError(f"{path} has a tensor {extra[0]}, which {first} has not: cannot average")
    for name in sorted(state):
        tensor, expected = state[name], reference[name]
        if tensor.shape != expected.shape:
            raise UserError(
                f"{path}: tensor {name} has shape {list(tensor.shape)}, in {first} "
                f"{list(expected.shape)}: cannot average"
            )
        if tensor.dtype != expected.dtype:
            raise UserError(
                f"{path}: tensor {name} is {tensor.dtype}, in {first} {expected.dtype}: "
                "cannot average checkpoints stored in different dtypes"
            )


def _accumulate(
    totals: dict[str, torch.Tensor], first: Path, reference: dict[str, torch.Tensor], path: Path
) -> None:
    """Add ``path``'s floating-point tensors to ``totals`` in fp32 (others: the last one's); its
    tensors are freed on return, before the next checkpoint loads."""
    state = load_state(path)
    check_same_tensors(first, reference, path, state)
    for name, tensor in state.items():
        if not tensor.is_floating_point():
            totals[name] = tensor
        elif name in totals:
            totals[name] += tensor.float()
        else:
            totals[name] = tensor.to(torch.float32, copy=True)


def average_checkpoints(paths: Sequence[Path], out: Path, force: bool = False) -> Path:
    """Average the weights of ``paths`` into checkpoint directory ``out`` (section 6.1).

    The checkpoints must hold the same tensors (names, shapes, dtypes: ``check_same_tensors``).
    Floating-point tensors are summed in float32 and the mean stored in their common dtype;
    other tensors (none in this model, but e.g. integer buffers) are taken from the last
    checkpoint. The tied matrix is stored once per file, so it is averaged once and stays
    tied when loaded. ``out`` is built in a new temporary directory and renamed into place;
    see ``check_average_out`` for what it may replace.
    """
    if not paths:
        raise UserError("no checkpoints to average")
    out = Path(out)
    check_average_out(out, paths, force)
    check_same_model(paths)
    # one checkpoint in memory at a time beside the sums (the big preset averages 20)
    first = Path(paths[0])
    reference = {n: torch.empty_like(t, device="meta") for n, t in load_state(first).items()}
    totals: dict[str, torch.Tensor] = {}
    for path in map(Path, paths):
        _accumulate(totals, first, reference, path)
    averaged = {
        name: (total / len(paths)).to(reference[name].dtype) if total.is_floating_point() else total
        for name, total in sorted(totals.items())
    }
    tmp = temp_dir_beside(out)
    try:
        save_file(
            averaged,
            str(tmp / WEIGHTS),
            metadata={"averaged_from": json.dumps([str(p) for p in paths])},
        )
        meta = read_meta(Path(paths[-1]))
        meta["averaged_from"] = [checkpoint_label(Path(p)) for p in paths]
        (tmp / META).write_text(json.dumps(meta, indent=2, sort_keys=True), encoding="utf-8")
        if (vocab_file := vocabulary_file(Path(paths[-1]))) is not None:
            copy_vocabulary(vocab_file, tmp)
        write_digests(tmp, [WEIGHTS])
        publish_dir(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already when published
    return out


def checkpoint_label(path: Path) -> str:
    """``update_N``, or ``update_N/ema`` for the averaged weights inside one."""
    return f"{path.parent.name}/{path.name}" if path.name == EMA_DIR else path.name


def ema_of(paths: Sequence[Path]) -> list[Path]:
    """The ``ema/`` checkpoints inside ``paths`` (``aiayn average --ema``)."""
    for p in paths:
        if not (Path(p) / EMA_DIR / META).is_file():
            raise UserError(
                f"{p} holds no moving average of its weights ({EMA_DIR}/): "
                "the run trained without ema_decay"
            )
    return [Path(p) / EMA_DIR for p in paths]


def choose_last(ckpt_root: Path, last: int) -> list[Path]:
    """The newest ``last`` complete checkpoints under ``ckpt_root``, oldest first; warns when
    fewer exist, naming ``keep_last`` only when it is why."""
    if last < 1:
        raise UserError(f"--last must be at least 1, got {last}")
    found = list_checkpoints(Path(ckpt_root))
    if not found:
        raise UserError(f"no checkpoints under {ckpt_root}")
    if len(found) < last:
        keep_last = read_meta(found[-1]).get("train_config", {}).get("keep_last")
        why = (
            f"the run's keep_last, {keep_last}, bounds how many are kept"
            if keep_last is not None and len(found) >= keep_last
            else "no more were saved"
        )
        warnings.warn(
            f"asked for the last {last} checkpoints, but {ckpt_root} holds only {len(found)}: "
            f"averaging {len(found)} ({why})",
            stacklevel=2,
        )
    return found[-last:]


def _recorded(ckpt: Path, metric: str) -> float | None:
    """The validation ``metric`` a checkpoint's meta.json records, if a finite one."""
    value = read_meta(ckpt).get("valid", {}).get(metric)
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def choose_best(ckpt_root: Path, best: int) -> list[Path]:
    """The ``best`` checkpoints under ``ckpt_root`` with the best validation by their run's
    ``best_metric`` (as each meta.json records it), oldest first; warns when fewer have one.

    Among the kept ones only: training prunes all but its ``keep_last`` newest and its best.
    """
    if best < 1:
        raise UserError(f"--best must be at least 1, got {best}")
    found = list_checkpoints(Path(ckpt_root))
    if not found:
        raise UserError(f"no checkpoints under {ckpt_root}")
    metric = read_meta(found[-1]).get("train_config", {}).get("best_metric", "valid_ppl")
    if metric not in LOWER_IS_BETTER:
        raise UserError(f"{found[-1] / META}: unknown best_metric {metric!r}")
    scored = [(value, p) for p in found if (value := _recorded(p, metric)) is not None]
    if not scored:
        raise UserError(
            f"no checkpoint under {ckpt_root} records a validation {metric} in its {META}: "
            "the run trained without validation (validate=false"
            + (", or valid_bleu_sentences=0" if metric == "valid_bleu" else "")
            + "); use --last"
        )
    if len(scored) < best:
        warnings.warn(
            f"asked for the best {best} checkpoints, but only {len(scored)} under {ckpt_root} "
            f"record a {metric}: averaging {len(scored)}",
            stacklevel=2,
        )
    sign = 1 if LOWER_IS_BETTER[metric] else -1
    scored.sort(key=lambda vp: sign * vp[0])  # stable: of equal ones, the older first
    return sorted(p for _, p in scored[:best])


def average_last_best(
    kept: list[Path], out: Path, score: Callable[[Path], float], force: bool = False
) -> tuple[Path, int, dict[int, float]]:
    """Average the last k of ``kept`` (paper section 6.1), with the k whose average ``score``
    rates lowest (e.g. ``evaluate.perplexity_on`` the validation split, never the test split).

    Why choose: the paper averaged checkpoints written 10 minutes apart late in a long run, when
    the weights move slowly; in a short run they move fast and old checkpoints drag the average
    back (docs/demo.md). Returns the averaged directory, the chosen k and the score of each k.
    ``out`` may replace what ``average_checkpoints`` may replace, nothing else.
    """
    check_average_out(out, kept, force)
    scratch = temp_dir_beside(out)
    try:
        score_by_k = {
            k: score(average_checkpoints(kept[-k:], scratch / str(k)))
            for k in range(1, len(kept) + 1)
        }
        best = min(score_by_k, key=score_by_k.__getitem__)
        publish_dir(scratch / str(best), out)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return out, best, score_by_k
