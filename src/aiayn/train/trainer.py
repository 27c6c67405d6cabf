"""The training loop of section 5: token-budget batches, Adam with the warm-up schedule,
label smoothing, gradient accumulation, DDP, mixed precision, atomic checkpoints, exact resume,
one run per OUT (a lock in OUT/.lock).

    trainer = Trainer(load_train_config("wmt14-base"))
    summary = trainer.run()

The gradient of one update does not depend on how its batch was split across micro-batches
and processes: every micro-batch back-propagates its *summed* loss, and before the optimizer
step the gradients are divided by the number of target tokens in the whole update (summed
over processes; DDP has already averaged over them, hence the factor world_size).
"""

from __future__ import annotations

import dataclasses
import json
import math
import signal
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from .. import checkpoint as ckpt
from ..data import TokenBudgetSampler, TokenDataset, check_vocab, collate, read_meta
from ..data.batching import corpus_ranges
from ..data.binarize import META
from ..data.pieces import load_vocabulary, resolve_vocabulary
from ..decode import DecodeConfig
from ..decode.translate import eval_mode
from ..errors import UserError
from ..files import exclusive_lock, lock_holder, write_text_atomic
from ..model import Transformer
from ..runtime.flops import mfu, paper_cost, real_lengths, training_flops
from ..runtime.hardware import bf16_support, keep_onednn_primitives
from ..runtime.kernels import BF16_MATMULS, bf16_matmul_attention
from ..runtime.policy import resolve_amp, resolve_attention, resolve_compile
from ..runtime.ready import for_training
from . import distributed
from .best import BestSoFar
from .config import RESOLVED, TrainConfig, resume_changes
from .ema import EMA
from .finetune import check_init_from, check_outside, start_model
from .loss import label_smoothed_nll, perplexity, teacher_forced
from .mixed import WeightCopies
from .schedule import noam_rate
from .validation import BleuSample, valid_bleu


class NonFiniteLossError(RuntimeError):
    pass


# The fp16 scaler halves its scale at every skipped step: 50 halvings from 2**16 leave
# 2**-34, where gradients that still overflow are not finite whatever the scale.
MAX_SKIPPED_STEPS = 50
LOCK = ".lock"  # in OUT: held by the run writing there
_BUDGETS = ("max_updates", "max_minutes")  # what ends a run by TrainConfig, as _done names them
_SIGNAL_NAMES = frozenset(s.name for s in signal.Signals)


@dataclass(frozen=True)
class Resolved:
    """What the config's ``amp`` and ``compile`` became on this device, and why: the progress
    line, log.jsonl, config.json, every meta.json, the summary and the demo report say it, so a
    reader knows why a run used what it used (``auto`` follows the chip)."""

    amp: str  # what autocast computes in: "bf16", "fp16" (with a gradient scaler) or "fp32"
    amp_reason: str
    compile: bool
    compile_reason: str

    @classmethod
    def of(cls, cfg: TrainConfig, device: torch.device) -> Resolved:
        amp, amp_reason = resolve_amp(cfg.amp, device)
        return cls(amp, amp_reason, *resolve_compile(cfg.compile, device))

    @property
    def amp_dtype(self) -> torch.dtype | None:
        return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.amp)

    def line(self) -> str:
        """One line for a person: ``precision fp32 (amp=auto and ...); compiled step off (...)``."""
        on = "on" if self.compile else "off"
        return (
            f"precision {self.amp} ({self.amp_reason}); compiled step {on} ({self.compile_reason})"
        )


def compile_layers(model: Transformer) -> None:
    """``torch.compile`` each encoder and decoder layer in place, forward and backward: the
    layers of a stack share one compiled graph (regional compilation), so compiling costs about
    one layer's time rather than N; parameter names, and so checkpoints, stay the model's.
    ``dynamic=True``: token-budget batches change shape at every update, and one graph of
    symbolic sizes serves them all instead of one recompilation per new shape."""
    for layer in [*model.encoder, *model.decoder]:
        layer.compile(dynamic=True)


def check_out_dir(out: Path) -> None:
    """Make the run directory ``out``, or a ``UserError`` naming the ``out`` key (a file, a
    folder without write permission) rather than the OS error on its lock file."""
    if out.exists() and not out.is_dir():
        raise UserError(f"out: {out} is a file, not a run directory; choose another out")
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / LOCK).touch()
    except OSError as err:
        raise UserError(
            f"out: {out}: cannot write there ({err.strerror}); choose another out"
        ) from None


class Trainer:
    def __init__(self, cfg: TrainConfig, device: str = "auto") -> None:
        self.cfg = cfg
        keep_onednn_primitives()  # before the first bf16 matmul: every batch has its own shape
        self.dist = distributed.setup(device)
        self.device = self.dist.device
        if cfg.num_threads:
            torch.set_num_threads(cfg.num_threads)
        self.update_freq = distributed.update_freq(cfg, self.dist.world_size)
        self.out = Path(cfg.out)
        self.ckpt_root = self.out / "checkpoints"
        self.data_meta = read_meta(cfg.data)
        self.vocab_file = resolve_vocabulary(cfg.data)  # spm.model, or two models (pieces.json)
        self.vocab = load_vocabulary(self.vocab_file)
        check_vocab(cfg.data, self.vocab)  # ids binarised with another vocabulary are garbage
        self.model_cfg = start_model(cfg, vocab_size=len(self.vocab))  # init_from's, if given
        self._build_model()
        self._build_optimizer()
        self.resolved = Resolved.of(cfg, self.device)
        self.amp_dtype = self.resolved.amp_dtype
        self.attention = resolve_attention(self.resolved.amp, self.device)
        # the step's forward: the linears' weights in amp_dtype, cast once per update (mixed.py)
        self.step_model = WeightCopies(self.ddp, self.amp_dtype)
        self.scaler = torch.amp.GradScaler(
            self.device.type, enabled=self.amp_dtype == torch.float16
        )
        self.train_data = TokenDataset(cfg.data, "train")
        self.sampler = TokenBudgetSampler(
            self.train_data.src_lens,
            self.train_data.tgt_lens,
            cfg.max_src_tokens,
            cfg.max_tgt_tokens,
            seed=cfg.seed,
            rank=self.dist.rank,
            world_size=self.dist.world_size,
            corpora=corpus_ranges(self.train_data.meta["splits"]["train"]),
        )
        self._check_data()
        self.bleu_sample, self.bleu_lang = None, ""
        if cfg.validate and cfg.valid_bleu_sentences:
            self.bleu_lang = self._valid_bleu_lang()
            valid = TokenDataset(cfg.data, "valid")
            self.bleu_sample = BleuSample.first(valid, self.vocab, cfg.valid_bleu_sentences)
        self.update = 0
        self.elapsed = 0.0  # training seconds, carried across resumes
        self.tokens = {"src": 0, "tgt": 0}
        self.flops = 0.0
        self.valid: dict[str, float] = {}
        self.best = BestSoFar(cfg.best_metric)  # rank 0's; the others learn its decisions
        self.stopped: str | None = None  # why the run ended
        self.stop_signal = 0  # a signal that asked this process to stop (request_stop)
        if self.resolved.compile:
            compile_layers(self.model)  # after EMA's copy: the average is only validated

    def _build_model(self) -> None:
        """The model (the same initial weights on every rank), its DDP wrapper and the moving
        average; then each rank's own dropout seed."""
        cfg = self.cfg
        torch.manual_seed(cfg.seed)  # identical initial weights on every rank
        self.model = for_training(Transformer(self.model_cfg, init=cfg.init), self.device)
        torch.manual_seed(cfg.seed * 1000 + self.dist.rank)  # independent dropout per rank
        self.ddp = DistributedDataParallel(self.model) if self.dist.enabled else self.model
        # kept by rank 0 only, which validates and saves; the weights are the same on every rank
        self.ema = (
            EMA(self.model, cfg.ema_decay, warmup=cfg.ema_warmup)
            if cfg.ema_decay and self.dist.is_main
            else None
        )

    def _build_optimizer(self) -> None:
        """Adam (section 5.3) under the warm-up schedule, which sets its learning rate."""
        cfg = self.cfg
        # fused=True: one kernel for all parameters instead of a loop over them (the trainer's
        # row against default Adam: docs/benchmarks.md, training); the same Adam arithmetic.
        self.optimizer = torch.optim.Adam(
            self.model.parameters(),
            lr=1.0,
            betas=(cfg.adam_beta1, cfg.adam_beta2),
            eps=cfg.adam_eps,
            fused=self.device.type in ("cpu", "cuda"),
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lambda step: noam_rate(step + 1, self.model_cfg.d_model, cfg.warmup, cfg.lr_scale),
        )

    # --- start-up checks ----------------------------------------------------------------

    def _check_data(self) -> None:
        """Fail now, not at the first checkpoint or the first long batch hours later: the
        train (and, when validating, valid) pairs the sampler will batch must exist and fit
        the model's positions."""
        cfg = self.cfg
        if not len(self.sampler.usable):
            raise UserError(
                f"no pair of the train split of {cfg.data} fits max_src_tokens={cfg.max_src_tokens} "
                f"and max_tgt_tokens={cfg.max_tgt_tokens}"
            )
        self._check_lengths(self.train_data, self.sampler.usable)
        if not cfg.validate:
            return
        try:
            valid = TokenDataset(cfg.data, "valid")
        except UserError as e:
            raise UserError(f"{e}: validation needs it (or set validate=false)") from None
        usable = TokenBudgetSampler(
            valid.src_lens, valid.tgt_lens, cfg.max_src_tokens, cfg.max_tgt_tokens, shuffle=False
        ).usable
        if not len(usable):
            raise UserError(
                f"the valid split of {cfg.data} has no pair within max_src_tokens/max_tgt_tokens: "
                "nothing to validate on (or set validate=false)"
            )
        self._check_lengths(valid, usable)

    def _check_lengths(self, data: TokenDataset, usable: np.ndarray) -> None:
        # A sequence of n subwords takes n + 1 positions: src + eos, bos + tgt (see collate).
        needed = 1 + max(int(data.src_lens[usable].max()), int(data.tgt_lens[usable].max()))
        limit = self.model_cfg.max_len
        if needed > limit:
            raise UserError(
                f"model.max_len={limit} is shorter than the {data.split} split of {self.cfg.data}, whose longest "
                f"pair needs {needed} positions (subwords + eos/bos): raise model.max_len to {needed}, "
                f"or prepare the data with --max-len {limit - 1}"
            )

    def _valid_bleu_lang(self) -> str:
        """The target language for the paper BLEU's Moses tokeniser: ``valid_bleu_lang``, else
        the one the dataset's meta.json records (``aiayn prepare`` records the corpora it
        knows). Never a guess: another language's tokeniser changes the score."""
        given, where = self.cfg.valid_bleu_lang, Path(self.cfg.data) / META
        recorded = self.data_meta.get("record", {}).get("tgt_lang")
        if given and recorded and given != recorded:
            raise UserError(
                f"valid_bleu_lang={given}, but {where} records the target language {recorded}: "
                "leave valid_bleu_lang out to use it, or give the dataset's language"
            )
        if not (given or recorded):
            raise UserError(
                f"valid_bleu_sentences={self.cfg.valid_bleu_sentences} scores BLEU with the "
                f"target language's tokeniser, and {where} records no language: set "
                "valid_bleu_lang (e.g. --set valid_bleu_lang=de), or valid_bleu_sentences=0"
            )
        return given or recorded

    # --- one update ---------------------------------------------------------------------

    @contextmanager
    def _autocast(self) -> Iterator[None]:
        """The step's precision: autocast in ``amp``, and the attention path (``attention``)."""
        if self.amp_dtype is None:
            yield
            return
        matmuls = self.attention == BF16_MATMULS
        with torch.autocast(self.device.type, dtype=self.amp_dtype), bf16_matmul_attention(matmuls):
            yield

    def train_update(self, batches: Iterator[list[int]]) -> dict[str, float]:
        """Forward/backward ``self.update_freq`` micro-batches, then one optimizer step."""
        self.ddp.train()
        self.step_model.refresh()
        sums = self._accumulate(batches)
        if self.dist.enabled:  # on the device: nccl reduces CUDA tensors only
            sums = sums.to(self.device)
            dist.all_reduce(sums)
            sums = sums.cpu()
        loss_sum, nll_sum, tgt_tokens, src_tokens, flops = sums.tolist()
        if not math.isfinite(loss_sum):
            self.optimizer.zero_grad(set_to_none=True)
            return {"finite": 0.0}
        if not self._step(tgt_tokens):
            return {"finite": 1.0, "stepped": 0.0}
        self.update += 1
        if self.ema is not None:
            self.ema.update(self.model, self.update)
        self.tokens["src"] += int(src_tokens)
        self.tokens["tgt"] += int(tgt_tokens)
        self.flops += flops  # summed over the ranks, like the tokens
        return {
            "finite": 1.0,
            "stepped": 1.0,
            "loss": loss_sum / tgt_tokens,
            "nll": nll_sum / tgt_tokens,
            "tokens": src_tokens + tgt_tokens,
        }

    def _accumulate(self, batches: Iterator[list[int]]) -> torch.Tensor:
        """Back-propagate the summed loss of each micro-batch (gradients synchronised across
        processes on the last one only); returns this process's (summed loss, summed nll,
        target tokens, source tokens, FLOPs), float64, on the CPU."""
        pad = self.model_cfg.pad_id
        losses = torch.zeros(2, device=self.device)  # summed loss, summed nll: no sync per step
        tgt_tokens = src_tokens = 0
        flops = 0.0
        for micro in range(self.update_freq):
            batch = collate(self.train_data, next(batches))
            flops += training_flops(
                self.model_cfg, real_lengths(batch.src, pad), real_lengths(batch.tgt_out, pad)
            )
            batch = batch.to(self.device)  # lengths counted on the CPU copy: no device sync
            last = micro == self.update_freq - 1
            ddp = self.ddp if isinstance(self.ddp, DistributedDataParallel) else None
            sync = nullcontext() if last or ddp is None else ddp.no_sync()
            with sync:
                mask = batch.tgt_out != pad
                with self._autocast():
                    logits = self.step_model(batch.src, batch.tgt_in, output_mask=mask)
                loss, nll = label_smoothed_nll(logits, batch.tgt_out[mask], self.cfg.eps_ls)
                self.scaler.scale(loss).backward()
            losses += torch.stack([loss.detach(), nll.detach()])
            tgt_tokens += batch.n_tgt_tokens
            src_tokens += batch.n_src_tokens
        counts = torch.tensor([tgt_tokens, src_tokens, flops], dtype=torch.float64)
        return torch.cat([losses.double().cpu(), counts])

    def _step(self, tgt_tokens: float) -> bool:
        """The optimizer step on the gradients of the update's ``tgt_tokens`` target tokens
        (summed over processes); False when the fp16 scaler skipped it."""
        self.scaler.unscale_(self.optimizer)
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        torch._foreach_mul_(grads, self.dist.world_size / tgt_tokens)
        scale = self.scaler.get_scale()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        stepped = self.scaler.get_scale() >= scale
        # fp16: a lowered scale means the scaler found inf/nan gradients and skipped the
        # optimizer step. No update happened, so neither the schedule nor the count advances.
        if stepped:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return stepped

    # --- validation -----------------------------------------------------------------------

    @torch.compiler.set_stance("force_eager")
    def validate(self) -> dict[str, Any]:
        """Loss and perplexity per subword on the valid split (no smoothing in the
        perplexity), and BLEU on its first ``valid_bleu_sentences`` pairs when asked; of
        the moving average of the weights when there is one.

        Eager even with ``compile``: the compiled layers serve the training step; validation's
        no-grad passes and beam search's growing cache would only compile graphs of their own."""
        model = self.ema.model if self.ema is not None else self.model
        scores: dict[str, Any] = self._valid_loss(model)
        if self.bleu_sample is not None:
            beam = {"beam": self.cfg.valid_beam} if self.cfg.valid_beam else {}
            decode = DecodeConfig.preset("translation", **beam)
            scores |= valid_bleu(model, self.vocab, self.bleu_sample, decode, lang=self.bleu_lang)
        return scores

    @torch.no_grad()
    def _valid_loss(self, model: Transformer) -> dict[str, float]:
        data = TokenDataset(self.cfg.data, "valid")
        sampler = TokenBudgetSampler(
            data.src_lens,
            data.tgt_lens,
            self.cfg.max_src_tokens,
            self.cfg.max_tgt_tokens,
            shuffle=False,
        )
        loss_sum = nll_sum = tokens = 0.0
        with eval_mode(model):
            for indices in sampler.epoch_batches(0):
                batch = collate(data, indices).to(self.device)
                with self._autocast():
                    loss, nll, n = teacher_forced(
                        model,
                        batch.src,
                        batch.tgt_in,
                        batch.tgt_out,
                        self.model_cfg.pad_id,
                        self.cfg.eps_ls,
                    )
                loss_sum, nll_sum, tokens = (
                    loss_sum + loss.item(),
                    nll_sum + nll.item(),
                    tokens + n,
                )
        return {
            "valid_loss": loss_sum / tokens,
            "valid_nll": nll_sum / tokens,
            "valid_ppl": perplexity(nll_sum, int(tokens)),
        }

    # --- checkpoints ----------------------------------------------------------------------

    def save(self, validate: bool = True) -> Path | None:
        """Validate (when configured and ``validate``), then write a checkpoint. A validation
        failure is reported only after the trained weights are saved: it must never cost the
        updates. A collective: every rank calls it."""
        rng = distributed.rng_states(self.dist)  # collective: every rank takes part
        path, failure = None, None
        if self.dist.is_main:
            if self.cfg.validate:
                self.valid = {}
                try:
                    self.valid = self.validate() if validate else {}
                except Exception as err:  # re-raised below, once the weights are safe
                    failure = err
            improved = self.best.observe(self.valid, self.update)
            state = {
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "scaler": self.scaler.state_dict(),
                "rng": rng,
            }
            path = ckpt.save_checkpoint(
                self.ckpt_root,
                self.update,
                self.model,
                self._checkpoint_meta(),
                state,
                self.vocab_file,
                keep_last=self.cfg.keep_last,
                best=improved,
                ema=self.ema.model if self.ema is not None else None,
            )
        if self.dist.enabled:
            dist.barrier()
        if failure is not None:
            saved = f"validation failed at update {self.update}; the trained weights were saved first, in {path}"
            if isinstance(failure, ValueError):  # a data problem: one line for the CLI
                raise UserError(f"{saved}: {failure}") from failure
            failure.add_note(saved)
            raise failure
        return path

    def _checkpoint_meta(self) -> dict[str, Any]:
        """A checkpoint's meta.json: where the run is (update, data position, time), its
        validation, and what it was trained with."""
        return {
            "update": self.update,
            "sampler": self.sampler.state_dict(),
            "elapsed_s": self.elapsed,
            "tokens": self.tokens,
            "flops": self.flops,
            "valid": self.valid,
            "best": self.best.state_dict(),
            "world_size": self.dist.world_size,
            "update_freq": self.update_freq,
            "model_config": dataclasses.asdict(self.model_cfg),
            "train_config": dataclasses.asdict(self.cfg),
            "vocab_fingerprint": self.vocab.fingerprint,
            "dataset": self.data_meta,  # its record says how the text was made
            RESOLVED: dataclasses.asdict(self.resolved),
        }

    def resume(self, path: Path) -> None:
        """Restore weights, optimizer, schedule, RNG and data position from checkpoint ``path``."""
        meta = ckpt.read_meta(path)
        if not (path / ckpt.TRAINER).is_file():
            raise UserError(
                f"{path} holds no trainer state ({ckpt.TRAINER}): an averaged or moving-average "
                "checkpoint cannot be resumed; resume from one training wrote, or fine-tune "
                "from it with --init-from"
            )
        if meta["vocab_fingerprint"] != self.vocab.fingerprint:
            raise UserError(
                f"{path} was trained with a different vocabulary than {self.vocab_file}; "
                "resume with the dataset it was trained on, or start a new run directory"
            )
        _check_same_model(path, meta["model_config"], dataclasses.asdict(self.model_cfg))
        self._resume_config(path, meta)
        if meta["world_size"] != self.dist.world_size:
            warnings.warn(
                f"{path} was written by {meta['world_size']} processes, now "
                f"{self.dist.world_size}: the data order will differ from an uninterrupted run",
                stacklevel=2,
            )
        ckpt.load_weights(self.model, path)
        self._resume_ema(path)
        state = ckpt.load_trainer_state(path)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        distributed.set_rng_states(state["rng"], self.dist)
        self.sampler.load_state_dict(meta["sampler"])
        self.update, self.elapsed = meta["update"], meta["elapsed_s"]
        self.tokens, self.flops, self.valid = meta["tokens"], meta["flops"], meta.get("valid", {})
        self.best = BestSoFar.resumed(self.cfg.best_metric, meta.get("best"))

    def _resume_config(self, path: Path, meta: dict[str, Any]) -> None:
        """Refuse a training key that may not change on resuming (``resume_changes``); apply
        the others; say from where the run resumes and what changed, in one line."""
        changes: list[str] = []
        if "train_config" in meta:
            same_data = (
                frozenset({"data"}) if meta.get("dataset") == self.data_meta else frozenset()
            )
            self.cfg, changes = resume_changes(
                meta["train_config"], self.cfg, where=str(path), also=same_data
            )
        if self.dist.is_main:
            with_changes = f" with {', '.join(changes)}" if changes else ""
            tqdm.write(
                f"train: resuming {self.out} from update {meta['update']} ({path}){with_changes}",
                file=sys.stderr,
            )

    def init_from(self, path: Path) -> None:
        """Start from another run's checkpoint ``path`` (fine-tuning on other data with its
        vocabulary): its weights, and its optimizer / schedule if ``init_from_keep`` says so;
        the update count, data order and RNG are this run's own."""
        keep = self.cfg.init_from_parts()
        check_init_from(path, out=self.out, vocab=self.vocab, model_cfg=self.model_cfg, keep=keep)
        ckpt.load_weights(self.model, path)
        if self.ema is not None:
            self.ema.reset(self.model)
        if keep:
            state = ckpt.load_trainer_state(path)
            if "optimizer" in keep:
                self.optimizer.load_state_dict(state["optimizer"])
            if "schedule" in keep:
                self.scheduler.load_state_dict(state["scheduler"])
        for group, lr in zip(self.optimizer.param_groups, self.scheduler.get_last_lr()):
            group["lr"] = lr  # a carried optimizer holds the old schedule's last rate

    def _resume_ema(self, path: Path) -> None:
        if self.ema is None:
            return
        if (path / ckpt.EMA_DIR / ckpt.META).is_file():
            ckpt.load_weights(self.ema.model, path / ckpt.EMA_DIR)
            return
        warnings.warn(
            f"{path} holds no moving average of the weights ({ckpt.EMA_DIR}/): "
            "it starts again from the resumed weights",
            stacklevel=3,
        )
        self.ema.reset(self.model)

    # --- the loop -------------------------------------------------------------------------

    def _agree(self, flag: bool) -> bool:
        """Rank 0's decision, shared so that every rank stops and saves at the same update."""
        if not self.dist.enabled:
            return flag
        t = torch.tensor([int(flag)], device=self.device)
        dist.broadcast(t, src=0)
        return bool(t.item())

    def _done(self) -> str | None:
        """Which budget is spent ("max_updates", "max_minutes"), if one is."""
        cfg = self.cfg
        if cfg.max_updates is not None and self.update >= cfg.max_updates:
            return "max_updates"
        if cfg.max_minutes is not None and self.elapsed >= cfg.max_minutes * 60:
            return "max_minutes"
        return None

    def request_stop(self, signum: int) -> None:
        """Stop after the update in progress, save and return (``preemption.stop_on_signals``
        calls it from a signal handler: it only records the signal; the first one counts)."""
        self.stop_signal = self.stop_signal or int(signum)

    @property
    def preempted(self) -> bool:
        """Whether a signal stopped the run (``stopped`` then names it: "SIGTERM")."""
        return self.stopped in _SIGNAL_NAMES

    def _stop_reason(self) -> str | None:
        """Why the run stops at this update boundary, if it does, the same on every rank: a
        spent budget by rank 0's clock, else a stop signal any rank received. One all_reduce
        (MAX) of two numbers, so that every rank stops, and saves, after the same update."""
        budget = self._done() if self.dist.is_main else None
        flags = torch.tensor([_BUDGETS.index(budget) + 1 if budget else 0, self.stop_signal])
        if self.dist.enabled:  # on the device: nccl reduces CUDA tensors only
            flags = flags.to(self.device)
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
            flags = flags.cpu()
        spent, signum = flags.tolist()
        if spent:
            return _BUDGETS[spent - 1]
        return signal.Signals(signum).name if signum else None

    @contextmanager
    def _lock_out(self) -> Iterator[None]:
        """One run per OUT: two would prune each other's checkpoints and interleave the log.
        Rank 0 holds OUT/.lock (the kernel drops it when rank 0 dies); every rank learns
        whether it got it, so that all stop, not only rank 0."""
        path = self.out / LOCK
        held = exclusive_lock(path, wait=False) if self.dist.is_main else nullcontext(True)
        with held as mine:
            if not self._agree(mine):
                pid = lock_holder(path)
                raise UserError(
                    f"{self.out} is in use by another training run (pid "
                    f"{pid if pid is not None else 'unknown'}, holding {path}); wait for it "
                    "to end, or choose another out"
                )
            yield

    def run(self, resume: str | Path | None = "auto") -> dict[str, Any]:
        """Train until max_updates or max_minutes, patience, or a stop asked for by
        ``request_stop``; returns the summary (also in summary.json)."""
        check_out_dir(self.out)
        with self._lock_out():
            return self._run(resume)

    def _run(self, resume: str | Path | None) -> dict[str, Any]:
        self._start(resume)
        log = _Log(self.out, enabled=self.dist.is_main)
        log.write({"update": self.update, RESOLVED: dataclasses.asdict(self.resolved)})
        bar = _progress(self.cfg, self.update, self.elapsed, enabled=self.dist.is_main)
        self._loop(iter(self.sampler), log, bar)
        bar.close()
        self._save_last(log)
        summary = self.summary() if self.dist.is_main else {}
        if self.dist.is_main:
            write_text_atomic(self.out / "summary.json", json.dumps(summary, indent=2))
        log.close()
        return summary

    def _start(self, resume: str | Path | None) -> None:
        """Resume (``resume``: a checkpoint, "auto" for OUT's latest, None for none) or start
        from ``init_from``; then record the config and say what precision the run uses."""
        if self.cfg.init_from:
            check_outside(Path(self.cfg.init_from), self.out)  # before resuming what is there
        start_path = ckpt.latest_checkpoint(self.ckpt_root) if resume == "auto" else resume
        if start_path:
            self.resume(Path(start_path))  # may take the run's own init_from into self.cfg
        elif self.cfg.init_from:
            self.init_from(Path(self.cfg.init_from))
        if self.dist.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            saved = {**dataclasses.asdict(self.cfg), RESOLVED: dataclasses.asdict(self.resolved)}
            write_text_atomic(self.out / "config.json", json.dumps(saved, indent=2))
            tqdm.write(f"train: {self.resolved.line()}", file=sys.stderr)

    def _loop(self, batches: Iterator[list[int]], log: _Log, bar: tqdm) -> None:
        """Update until a budget, patience or a stop signal ends the run (``self.stopped``
        says which), logging every ``log_every`` updates and saving when due."""
        now = time.monotonic()
        loop = _LoopState(t0=now - self.elapsed, last_save=now, window_start=now)
        while (reason := self._stop_reason()) is None:
            stats = self.train_update(batches)
            self.elapsed = time.monotonic() - loop.t0
            if not self._stepped(stats, loop):
                continue
            loop.window_tokens += stats["tokens"]
            if self.update % self.cfg.log_every == 0:
                self._log_update(stats, loop, log, bar)
            _advance(bar, self.update, self.elapsed, self.cfg)
            if self._agree(self._save_due(loop)):
                self._save_on_schedule(loop, log, bar)
                if self._out_of_patience(bar):
                    return
        self.stopped = reason

    def _stepped(self, stats: dict[str, float], loop: _LoopState) -> bool:
        """Whether the update just tried moved the weights. A non-finite loss skips it with a
        warning, and ``max_nonfinite`` in a row abort; ``MAX_SKIPPED_STEPS`` steps in a row
        that the fp16 scaler skipped (overflowing gradients) abort too."""
        cfg = self.cfg
        if not stats["finite"]:
            loop.nonfinite += 1
            warnings.warn(
                f"non-finite loss at update {self.update + 1}: update skipped "
                f"({loop.nonfinite} in a row, limit {cfg.max_nonfinite})",
                stacklevel=2,
            )
            if loop.nonfinite >= cfg.max_nonfinite:
                raise NonFiniteLossError(
                    f"{loop.nonfinite} non-finite losses in a row at update {self.update + 1}: "
                    "lower lr_scale, raise warmup, or use amp=bf16/none"
                )
            return False
        loop.nonfinite = 0
        loop.skipped = 0 if stats["stepped"] else loop.skipped + 1
        if loop.skipped >= MAX_SKIPPED_STEPS:
            raise NonFiniteLossError(
                f"the fp16 gradient scaler skipped {loop.skipped} steps in a row at update "
                f"{self.update + 1}: the gradients are not finite; use amp=bf16/none"
            )
        return not loop.skipped

    def _log_update(self, stats: dict[str, float], loop: _LoopState, log: _Log, bar: tqdm) -> None:
        """One line of log.jsonl (and TensorBoard) and the progress bar's loss, rate and speed."""
        now = time.monotonic()
        record = {
            "update": self.update,
            "loss": stats["loss"],
            "nll": stats["nll"],
            "lr": self.scheduler.get_last_lr()[0],
            "tok_s": loop.window_tokens / (now - loop.window_start),
            "elapsed_s": self.elapsed,
        }
        loop.window_tokens, loop.window_start = 0.0, now
        log.write(record)
        loop.shown |= {
            "loss": f"{record['loss']:.3f}",
            "lr": f"{record['lr']:.2e}",
            "tok_s": f"{record['tok_s']:.0f}",
        }
        bar.set_postfix(loop.shown, refresh=False)

    def _save_due(self, loop: _LoopState) -> bool:
        """Whether a checkpoint is due: every ``save_every_updates`` updates or
        ``save_every_minutes`` minutes (rank 0's clock decides, through ``_agree``)."""
        cfg = self.cfg
        every_updates = cfg.save_every_updates and self.update % cfg.save_every_updates == 0
        every_minutes = (
            cfg.save_every_minutes
            and time.monotonic() - loop.last_save >= cfg.save_every_minutes * 60
        )
        return bool(every_updates or every_minutes)

    def _save_on_schedule(self, loop: _LoopState, log: _Log, bar: tqdm) -> None:
        """A checkpoint (validated), off the training clock: validation and I/O do not count
        against ``max_minutes``."""
        paused = time.monotonic()
        self._save_and_log(log)
        loop.last_save = time.monotonic()
        loop.t0 += loop.last_save - paused
        loop.shown |= _shown_validation(self.valid)
        bar.set_postfix(loop.shown, refresh=False)

    def _out_of_patience(self, bar: tqdm) -> bool:
        """Rank 0's decision (it alone validates), shared so that every rank stops."""
        if not self._agree(self.best.out_of_patience(self.cfg.patience)):
            return False
        self.stopped = "patience"
        bar.set_description(
            f"stopped: no better {self.cfg.best_metric} in {self.cfg.patience} validations"
        )
        return True

    def _save_last(self, log: _Log) -> None:
        """The checkpoint of the last update, unless the newest one is of it already. After a
        stop signal it is saved without validating, which can take longer than a scheduler
        waits before SIGKILL, and it is not counted by ``patience``; nothing is saved before
        the first update."""
        latest = ckpt.latest_checkpoint(self.ckpt_root)
        if latest is not None and ckpt.read_meta(latest)["update"] == self.update:
            return
        if not self.preempted:
            self._save_and_log(log)
        elif self.update:
            self._save_and_log(log, validate=False)

    def _save_and_log(self, log: _Log, validate: bool = True) -> None:
        self.save(validate)
        log.write({"update": self.update, "elapsed_s": self.elapsed, **self.valid})

    def summary(self) -> dict[str, Any]:
        """The run in numbers (summary.json). The chip's matmul peak, and with it MFU and
        the paper's cost estimate (``cost``), is measured where a report is made: a benchmark
        of the machine is no part of training."""
        latest = ckpt.latest_checkpoint(self.ckpt_root)
        return {
            "updates": self.update,
            "elapsed_s": self.elapsed,
            "devices": self.dist.world_size,
            "update_freq": self.update_freq,
            "device": str(self.device),
            RESOLVED: dataclasses.asdict(self.resolved),
            "attention": self.attention,  # the path resolve_attention chose
            "tokens": self.tokens,
            "tokens_per_s": (self.tokens["src"] + self.tokens["tgt"]) / max(self.elapsed, 1e-9),
            "counted_flops": self.flops,
            **self.valid,
            "stopped": self.stopped,
            # absolute: any cwd; None when a stop signal came before the first update
            "checkpoint": str(latest.resolve()) if latest is not None else None,
            **self._best_summary(),
        }

    @property
    def peak_dtype(self) -> torch.dtype | None:
        """The dtype to measure the matmul peak in, for ``cost``: autocast's where the chip
        computes in it natively; emulated reduced precision runs through fp32, so there the
        chip's peak is its fp32 one (None: ``measure_matmul_peak``'s default)."""
        native = self.device.type == "cuda" or bf16_support(self.device).native
        return self.amp_dtype if native else None

    def cost(self, peak: float) -> dict[str, float]:
        """The run's cost in the paper's terms against a matmul peak of ``peak`` FLOP/s
        (``flops.measure_matmul_peak(trainer.device, trainer.peak_dtype)``): Table 2's
        estimate (time x devices x peak) and the model FLOPs utilisation."""
        devices, seconds = self.dist.world_size, max(self.elapsed, 1e-9)
        return {
            "paper_cost_flops": paper_cost(self.elapsed, devices, peak),
            "matmul_peak_flops": peak,
            "mfu": mfu(self.flops, seconds, peak, devices),
        }

    def _best_summary(self) -> dict[str, Any]:
        best = ckpt.best_checkpoint(self.ckpt_root)
        if best is None:
            return {}
        return {"best": {**self.best.state_dict(), "checkpoint": str(best.resolve())}}


def _check_same_model(path: Path, saved: dict[str, Any], now: dict[str, Any]) -> None:
    """Refuse to resume ``path`` into another model, naming in one line only the keys that
    differ, with both values (a whole ModelConfig twice hides the one that changed)."""
    differ = [k for k in sorted(saved.keys() | now.keys()) if saved.get(k) != now.get(k)]
    if differ:
        shown = ", ".join(f"{k} {saved.get(k)!r} -> {now.get(k)!r}" for k in differ)
        raise UserError(
            f"{path}: resuming would change the model: {shown}; give the run's values back "
            "(model.KEY / preset), or start a new out"
        )


@dataclass
class _LoopState:
    """What the loop carries from update to update."""

    t0: float  # when training began on the monotonic clock, less its pauses (validation, I/O)
    last_save: float
    window_start: float  # of the throughput window that the next log line reports
    window_tokens: float = 0.0
    nonfinite: int = 0  # non-finite losses in a row
    skipped: int = 0  # fp16 steps skipped in a row
    shown: dict[str, str] = field(default_factory=dict)  # the progress bar's postfix


class _Log:
    """JSONL log and TensorBoard scalars, written by rank 0 only."""

    def __init__(self, out: Path, enabled: bool) -> None:
        self.enabled = enabled
        if enabled:
            from torch.utils.tensorboard import SummaryWriter

            self.jsonl = open(out / "log.jsonl", "a", encoding="utf-8")
            self.tb = SummaryWriter(str(out / "tensorboard"))

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self.jsonl.write(json.dumps(record) + "\n")
        self.jsonl.flush()
        for key, value in record.items():
            if key != "update" and isinstance(value, (int, float)):
                self.tb.add_scalar(key, value, record["update"])

    def close(self) -> None:
        if self.enabled:
            self.jsonl.close()
            self.tb.close()


def _shown_validation(valid: dict[str, Any]) -> dict[str, str]:
    """The progress bar's view of a validation: perplexity, and BLEU when measured."""
    names = {"valid_ppl": ("ppl", "{:.2f}"), "valid_bleu": ("bleu", "{:.1f}")}
    return {short: form.format(valid[key]) for key, (short, form) in names.items() if key in valid}


def _advance(bar: tqdm, update: int, elapsed: float, cfg: TrainConfig) -> None:
    bar.n = min(int(elapsed), bar.total or 0) if cfg.max_minutes else update
    bar.refresh()


def _progress(cfg: TrainConfig, update: int, elapsed: float, enabled: bool) -> tqdm:
    """Updates out of max_updates, or seconds out of the time budget when one is set."""
    if cfg.max_minutes:
        return tqdm(
            total=int(cfg.max_minutes * 60),
            initial=int(elapsed),
            unit="s",
            desc="train",
            disable=not enabled,
            dynamic_ncols=True,
        )
    return tqdm(
        total=cfg.max_updates,
        initial=update,
        unit="upd",
        desc="train",
        disable=not enabled,
        dynamic_ncols=True,
    )
