"""The training configuration: plain data, every key typed, unknown keys rejected.

A config file (YAML or TOML) holds TrainConfig's keys; ``model`` holds ModelConfig
overrides on top of ``preset``. ``--set key=value`` overrides either (``model.d_ff=1024``);
which value wins is one rule, ``resolve_train_config``'s.
The resolved config is saved with every checkpoint, so runs can be diffed and reproduced.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml

from ..config import PRESETS, Init, ModelConfig, from_dict, parse_assignments
from ..errors import UserError

RESOLVED = "resolved"  # config.json's block of what the run made of amp and compile
# TrainConfig's keys that count something: None (where allowed) or at least 1
_AT_LEAST_ONE = (
    "max_src_tokens",
    "max_tgt_tokens",
    "update_freq",
    "warmup",
    "keep_last",
    "max_nonfinite",
    "log_every",
    "max_updates",
    "save_every_updates",
    "num_threads",
    "patience",
    "valid_beam",
    "tokens_per_update",
)


@dataclass
class TrainConfig:
    """Section 5 of the paper; defaults are the paper's base recipe."""

    data: str = "work/bible"  # a directory written by `aiayn prepare`
    out: str = "runs/base"  # checkpoints, logs, TensorBoard
    preset: str = "base"
    model: dict[str, Any] = field(default_factory=dict)  # ModelConfig overrides
    # 5.1: ~25,000 source + 25,000 target tokens per update = per-batch budget x update_freq x GPUs
    max_src_tokens: int = 4096
    max_tgt_tokens: int = 4096
    update_freq: int = 1  # gradient accumulation: micro-batches per update
    # ... or the tokens (per side) of an update, whatever the number of processes: derives
    # update_freq = tokens_per_update / (max_tgt_tokens x processes) (paper: ~25000)
    tokens_per_update: int | None = None
    # 5.3: Adam(0.9, 0.98, 1e-9), warm-up 4000 then inverse square root
    adam_beta1: float = 0.9
    adam_beta2: float = 0.98
    adam_eps: float = 1e-9
    warmup: int = 4000
    lr_scale: float = 1.0  # multiplies the paper's schedule; 1.0 = the paper
    # 5.4
    eps_ls: float = 0.1
    # stopping, checkpoints (paper: every 10 minutes, average the last 5 / 20)
    max_updates: int | None = 100_000
    max_minutes: float | None = None
    save_every_minutes: float | None = 10.0
    save_every_updates: int | None = None
    keep_last: int = 5
    # how a new run's weights start (the paper does not say): "fairseq" learns much faster
    # early than "xavier" (model.Transformer.reset_parameters; docs/experiments.md, "peers")
    init: Init = "fairseq"
    # ... or another run's checkpoint (fine-tuning, same vocabulary): its weights, and with
    # init_from_keep "optimizer", "schedule" or both (comma-separated) its Adam state / schedule
    init_from: str | None = None
    init_from_keep: str = ""
    # machinery
    seed: int = 1
    # auto: bf16 where the chip computes in it natively (CUDA with bf16, a CPU with avx512_bf16
    # or AMX), fp16 with a gradient scaler on older CUDA, fp32 elsewhere (policy.resolve_amp)
    amp: Literal["auto", "bf16", "fp16", "none"] = "auto"
    # torch.compile of each encoder and decoder layer's forward and backward; auto: where it
    # pays back its compile time in the first 5% of a demo run (policy.resolve_compile)
    compile: bool | Literal["auto"] = "auto"
    max_nonfinite: int = 5  # consecutive non-finite losses before aborting
    num_threads: int | None = None  # CPU threads (None: torch's default)
    log_every: int = 10
    validate: bool = True  # validation loss/perplexity at every checkpoint
    # ... and BLEU of beam search on the first N valid pairs (0: none); beam None: the
    # translation preset's; lang: the target language of the paper BLEU's Moses tokeniser
    # (None: the one the dataset's meta.json records; a dataset without one needs it)
    valid_bleu_sentences: int = 0
    valid_beam: int | None = None
    valid_bleu_lang: str | None = None
    # checkpoints/best names the checkpoint with the best validation by this metric so far
    best_metric: Literal["valid_ppl", "valid_bleu"] = "valid_ppl"
    patience: int | None = None  # stop after this many validations without a better one
    # not in the paper: a moving average of the weights, validated and saved (update_N/ema/)
    ema_decay: float | None = None
    ema_warmup: bool = False  # decay min(ema_decay, (1+n)/(10+n)) at update n: for short runs

    def __post_init__(self) -> None:
        """Every numeric key is range-checked: a negative, nan or infinite learning rate
        would otherwise train on garbage for the whole run and exit 0. Then the keys that
        need another key are checked, and the model overrides are type-checked."""
        if self.preset not in PRESETS:
            raise UserError(f"unknown preset {self.preset!r}; choose one of: {', '.join(PRESETS)}")
        self._check_ranges()
        self._check_choices()
        self._check_pairs()
        self.model_config(vocab_size=None)  # type-checks the model overrides early

    def _check_ranges(self) -> None:
        """Counts at least 1, probabilities in [0, 1), rates and times positive and finite."""
        for name in _AT_LEAST_ONE:
            value = getattr(self, name)
            if value is not None and value < 1:
                raise UserError(f"TrainConfig.{name} must be >= 1, got {value}")
        if self.num_threads is not None and self.num_threads > 1024:
            raise UserError(f"TrainConfig.num_threads must be at most 1024, got {self.num_threads}")
        if not 0 <= self.seed < 2**32:
            raise UserError(f"TrainConfig.seed must be in [0, 2**32), got {self.seed}")
        for name in ("adam_beta1", "adam_beta2", "eps_ls"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise UserError(f"TrainConfig.{name} must be in [0, 1), got {getattr(self, name)}")
        for name in ("adam_eps", "lr_scale", "max_minutes", "save_every_minutes"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise UserError(f"TrainConfig.{name} must be a positive finite number, got {value}")
        if self.valid_bleu_sentences < 0:
            raise UserError(
                f"TrainConfig.valid_bleu_sentences must be >= 0, got {self.valid_bleu_sentences}"
            )
        if self.ema_decay is not None and not 0.0 < self.ema_decay < 1.0:
            raise UserError(f"TrainConfig.ema_decay must be in (0, 1), got {self.ema_decay}")

    def _check_choices(self) -> None:
        """The keys of a few allowed values, and init_from_keep's parts."""
        for name, allowed in (
            ("amp", ("auto", "bf16", "fp16", "none")),
            ("compile", (True, False, "auto")),
        ):
            if getattr(self, name) not in allowed:
                raise UserError(
                    f"TrainConfig.{name} must be one of {allowed}, got {getattr(self, name)!r}"
                )
        unknown = set(self.init_from_parts()) - {"optimizer", "schedule"}
        if unknown:
            raise UserError(
                f"TrainConfig.init_from_keep: unknown {', '.join(sorted(unknown))}; "
                "keep optimizer, schedule or both (optimizer,schedule)"
            )

    def _check_pairs(self) -> None:
        """A key that means nothing without another is refused, not ignored in silence."""
        if self.max_updates is None and self.max_minutes is None:
            raise UserError("set max_updates or max_minutes (or both): training must stop")
        if self.init_from_keep and self.init_from is None:
            raise UserError(
                "TrainConfig.init_from_keep needs init_from: the checkpoint to keep from"
            )
        if self.tokens_per_update is not None and self.update_freq != 1:
            raise UserError(
                "TrainConfig.tokens_per_update derives update_freq: set one of them, not both "
                "(tokens_per_update=none to give update_freq)"
            )
        if self.ema_warmup and self.ema_decay is None:
            raise UserError("TrainConfig.ema_warmup warms up the moving average: set ema_decay too")
        if self.patience is not None and not self.validate:
            raise UserError("TrainConfig.patience needs validation: set validate=true")
        if self.best_metric == "valid_bleu" and not self.valid_bleu_sentences:
            raise UserError(
                "TrainConfig.best_metric=valid_bleu needs validation BLEU: set valid_bleu_sentences"
            )

    def init_from_parts(self) -> list[str]:
        """What ``init_from_keep`` names: ["optimizer"], ["schedule"], both, or []."""
        return [part.strip() for part in self.init_from_keep.split(",") if part.strip()]

    def model_config(self, vocab_size: int | None) -> ModelConfig:
        """The preset, the overrides, and the dataset's vocabulary size."""
        base = dataclasses.asdict(ModelConfig.preset(self.preset))
        overrides = dict(self.model)
        if vocab_size is not None:
            overrides["vocab_size"] = vocab_size
        return from_dict(ModelConfig, {**base, **overrides}, where="model")


# What a resumed run may change (``resume_changes``): when it stops, saves, logs and validates,
# and the machinery (amp and compile change the arithmetic of later updates, not their
# meaning). Every other key shapes the updates themselves (the data and its order, the
# optimizer and its schedule, the loss, the initial weights, the moving average) or the
# comparison behind checkpoints/best, and is refused: the run would no longer be one run.
RESUME_MAY_CHANGE = frozenset(
    {
        "out",
        "max_updates",
        "max_minutes",
        "save_every_minutes",
        "save_every_updates",
        "keep_last",
        "amp",
        "compile",
        "max_nonfinite",
        "num_threads",
        "log_every",
        "validate",
        "valid_bleu_sentences",
        "valid_beam",
        "valid_bleu_lang",
        "patience",
    }
)
# Compared through the model config the checkpoint records (``Trainer.resume``), not as keys.
_MODEL_KEYS = frozenset({"preset", "model"})
# How a run started: ``--init-from`` left out on resuming keeps the run's own.
_START_KEYS = ("init_from", "init_from_keep")


def resume_changes(
    saved: dict[str, Any], cfg: TrainConfig, *, where: str, also: frozenset[str] = frozenset()
) -> tuple[TrainConfig, list[str]]:
    """(the config to resume with, "key old -> new" for each key it changes) for a run whose
    checkpoint ``where`` recorded ``saved`` (its TrainConfig as a dict). A ``UserError`` names,
    in one line, every key that differs and may not (``RESUME_MAY_CHANGE``, and ``also``: what
    the caller found may change, e.g. ``data`` for the same dataset moved). Without
    ``init_from`` the run keeps its own (the CLI resumes OUT whatever ``--init-from`` says)."""
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    start = {k: saved[k] for k in _START_KEYS if k in saved}
    if not cfg.init_from and not cfg.init_from_keep:
        cfg = dataclasses.replace(cfg, **start)
    now = dataclasses.asdict(cfg)
    differ = [
        k for k in sorted(known - _MODEL_KEYS) if k in saved and _plain(saved[k]) != _plain(now[k])
    ]
    refused = {k for k in differ if k not in RESUME_MAY_CHANGE | also}
    if cfg.best_metric == "valid_bleu":  # checkpoints/best compares BLEU on these sentences
        refused |= {k for k in differ if k.startswith("valid_b")}
    changes = [f"{k} {saved[k]!r} -> {now[k]!r}" for k in differ]
    if refused:
        shown = ", ".join(c for k, c in zip(differ, changes) if k in refused)
        raise UserError(
            f"{where}: resuming would change what the run was trained with: {shown}; give "
            "the run's values back, or start a new out (--init-from the checkpoint to "
            "fine-tune from it)"
        )
    return cfg, changes


def _plain(value: Any) -> Any:
    """A config value as its JSON record reads back (tuples as lists)."""
    return json.loads(json.dumps(value))


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The top-level mapping of a YAML, TOML or JSON file; a broken file is named with the
    line of its first error."""
    path = Path(path)
    if path.suffix not in (".toml", ".yaml", ".yml", ".json"):
        raise UserError(f"{path}: config files are .yaml, .yml, .toml or .json")
    if not path.is_file():
        raise UserError(
            f"{path}: {'is a directory' if path.is_dir() else 'no such file'}, not a config file"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: invalid UTF-8 at byte {e.start}") from None
    try:
        data = _parse_config(text, path.suffix)
    except RecursionError:
        raise UserError(f"{path}: nested too deeply to be a config") from None
    except (yaml.YAMLError, ValueError) as e:  # every decoder error of the three is one of these
        raise UserError(f"{path}: {_config_error(e, path.suffix)}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping of keys to values at the top level")
    return data


def bundled_configs() -> dict[str, Path]:
    """{name: file} of the recipes shipped in ``aiayn/configs/`` (package data, so a wheel has them)."""
    root = Path(str(resources.files("aiayn") / "configs"))
    return {p.stem: p for p in sorted(root.glob("*.yaml"))}


def find_config(path: str | os.PathLike) -> Path:
    """A config file on disk, or else the bundled recipe of that name (``aiayn train wmt14-base``)."""
    if Path(path).exists():
        return Path(path)
    bundled = bundled_configs()
    if str(path) in bundled:
        return bundled[str(path)]
    raise FileNotFoundError(
        f"{path}: no such config file, and no bundled config of that name "
        f"(bundled: {', '.join(bundled)})"
    )


def _parse_config(text: str, suffix: str) -> Any:
    if suffix == ".toml":
        return tomllib.loads(text)
    if suffix == ".json":
        return json.loads(text)
    return yaml.safe_load(text) or {}


def _config_error(e: Exception, suffix: str) -> str:
    """``line N: invalid FORMAT (problem)`` from whichever parser failed."""
    kind = {".toml": "TOML", ".json": "JSON"}.get(suffix, "YAML")
    if isinstance(e, json.JSONDecodeError):
        return f"line {e.lineno}: invalid JSON ({e.msg})"
    if isinstance(e, yaml.MarkedYAMLError) and e.problem_mark is not None:
        return f"line {e.problem_mark.line + 1}: invalid YAML ({e.problem})"
    if isinstance(e, tomllib.TOMLDecodeError):
        m = re.search(r"^(.*) \(at line (\d+), column \d+\)$", str(e))
        if m:
            return f"line {m.group(2)}: invalid TOML ({m.group(1)})"
    return f"invalid {kind} ({e})"


def recipe_config(name: str, sets: Sequence[str] = (), **keys: Any) -> TrainConfig:
    """The bundled recipe ``name`` (``aiayn/configs/NAME.yaml``) with ``keys`` in place of its
    own (a run's data, out, budget) and then ``sets``, by ``resolve_train_config``'s rule."""
    path = bundled_configs()[name]
    data = {**read_config_file(path), **keys}
    cfg = resolve_train_config(data, sets, where=str(path))
    return recipe_language(cfg, data, sets, recipe=name)


def load_train_config(
    path: str | os.PathLike | None, sets: Sequence[str] = (), **defaults: Any
) -> TrainConfig:
    """The config of ``path`` with ``--set`` strings, by ``resolve_train_config``'s rule.

    ``path`` is a config file or the name of a bundled one (``bundled_configs``); ``defaults``
    are a command's own (``aiayn parse train``'s preset).
    """
    file = find_config(path) if path else None
    data = read_config_file(file) if file else {}
    cfg = resolve_train_config(data, sets, defaults=defaults, where=str(file or "config"))
    if file is not None and path is not None and not Path(path).exists():  # a bundled recipe
        cfg = recipe_language(cfg, data, sets, recipe=str(path))
    return cfg


def recipe_language(
    cfg: TrainConfig, data: dict[str, Any], sets: Sequence[str], *, recipe: str
) -> TrainConfig:
    """``cfg`` with a bundled recipe's ``valid_bleu_lang`` (``data``: the recipe's keys) kept
    to the data it was written for: the dataset's recorded target language replaces it, and a
    dataset that records none is refused, since the recipe's language (the demo's Spanish)
    would score another language's BLEU with the wrong tokeniser. A language given with
    ``--set`` is the user's and stays."""
    given_by_user = any(s.split("=", 1)[0].strip() == "valid_bleu_lang" for s in sets)
    if given_by_user or "valid_bleu_lang" not in data:
        return cfg
    if not (cfg.validate and cfg.valid_bleu_sentences):
        return cfg
    meta_path = Path(cfg.data) / "meta.json"
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return cfg  # no dataset there (yet): the trainer names the problem
    recorded = meta.get("record", {}).get("tgt_lang") if isinstance(meta, dict) else None
    if recorded:
        return dataclasses.replace(cfg, valid_bleu_lang=recorded)
    raise UserError(
        f"valid_bleu_lang={cfg.valid_bleu_lang} is the {recipe} recipe's, for its own data, and "
        f"{meta_path} records no language: prepare the data with --tgt-lang LANG, or "
        "--set valid_bleu_lang=LANG (or valid_bleu_sentences=0)"
    )


def resolve_train_config(
    file: dict[str, Any],
    sets: Sequence[str] = (),
    *,
    defaults: dict[str, Any] | None = None,
    where: str = "config",
) -> TrainConfig:
    """The one precedence rule, key by key (``model.KEY`` too), whatever the source:

    TrainConfig's defaults < ``defaults`` < the preset's training overrides
    (``PRESETS[name].train``, e.g. big's 300k updates) < ``file`` < ``sets`` (``--set``);
    for ``model`` keys the preset's fields (``TrainConfig.model_config``) take that place.

    The preset is the one named last (``--set``, else the file, else ``defaults``), so
    ``--set preset=big`` brings big's overrides, which keys the file or ``--set`` give still beat.
    Every value given lands as written, even one equal to the preset's. ``file`` is a config's
    mapping (or a recipe's, the demo's) and ``where`` names it in errors.
    """
    defaults = defaults or {}
    # a run's config.json records what amp/compile resolved to beside its keys; each run
    # resolves them again on its own device
    file = {key: value for key, value in file.items() if key != RESOLVED}
    train_sets, model_sets = _parse_sets(sets)
    preset = train_sets.get(
        "preset", file.get("preset", defaults.get("preset", TrainConfig.preset))
    )
    preset_train = PRESETS[preset].train if isinstance(preset, str) and preset in PRESETS else {}
    below_sets = {**defaults, **preset_train, **file}
    checked = from_dict(TrainConfig, below_sets, where=where)  # the file's mistakes name the file
    model = {**defaults.get("model", {}), **checked.model, **model_sets}
    return from_dict(TrainConfig, {**below_sets, **train_sets, "model": model}, where="--set")


def _parse_sets(sets: Sequence[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(TrainConfig keys, ModelConfig keys) of ``key=value`` / ``model.key=value`` strings, typed."""
    model = [s[len("model.") :] for s in sets if s.startswith("model.")]
    train = [s for s in sets if not s.startswith("model.")]
    return parse_assignments(TrainConfig, train), parse_assignments(
        ModelConfig, model, where="--set model"
    )
