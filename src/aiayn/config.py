"""Typed configuration: the model's hyper-parameters with the paper's names and defaults.

Configuration is plain data (dataclasses). Presets are named after the paper: "base", "big",
every Table 3 row ("A-h1" ... "E-learned"), "parsing" (Table 4), plus small CPU presets. The
helpers at the bottom turn dicts and ``key=value`` strings into dataclasses with every key
type-checked and unknown keys rejected, so that saved configs can be diffed and reloaded.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from .errors import UserError

T = TypeVar("T")

# How a new model's weights start; the paper does not say (``model.Transformer.reset_parameters``).
Init = Literal["fairseq", "xavier"]


@dataclass
class ModelConfig:
    """Hyper-parameters of the Transformer (paper section 3, Table 3 column names).

    ``d_k`` and ``d_v`` default to ``d_model // h`` but can be set independently (Table 3 row B).
    Every deviation from the paper is an explicit option whose default is the paper's choice.
    """

    N_enc: int = 6
    N_dec: int = 6
    d_model: int = 512
    d_ff: int = 2048
    h: int = 8
    d_k: int | None = None  # None: d_model // h
    d_v: int | None = None  # None: d_model // h
    P_drop: float = 0.1
    vocab_size: int = 37000
    pad_id: int = 0
    max_len: int = 1024
    # --- deviations from the paper, each off by default ---
    norm: Literal["post", "pre"] = "post"  # "pre": LayerNorm before each sub-layer + final norm
    # "learned": Table 3 row E; "marian": Marian's sinusoids (timescales 10000^(i/(d/2-1)));
    # "fairseq": the same sinusoids from position 2 (fairseq counts from padding_idx + 1)
    positional: Literal["sinusoidal", "learned", "marian", "fairseq"] = "sinusoidal"
    scale_attention: bool = True  # False: no 1/sqrt(d_k) (the paper's open question)
    attention_window: int | None = None  # r: restricted self-attention of Table 1
    share_embeddings: bool = True  # one matrix for both embeddings and the pre-softmax layer
    attention_dropout: float = 0.0  # the parsing section mentions attention dropout
    activation: Literal["relu", "swish", "gelu"] = "relu"  # the FFN's; OPUS-MT models use swish
    output_bias: bool = False  # a bias on the pre-softmax layer (Marian's final_logits_bias)
    norm_eps: float = 1e-5  # LayerNorm's epsilon (PyTorch's; Marian's own models: 1e-9)

    def __post_init__(self) -> None:
        self.validate()

    @property
    def resolved_d_k(self) -> int:
        """The per-head query/key width in force: ``d_k`` where set (None means d_model / h)."""
        return self.d_k if self.d_k is not None else self.d_model // self.h

    @property
    def resolved_d_v(self) -> int:
        """The per-head value width in force: ``d_v`` where set (None means d_model / h)."""
        return self.d_v if self.d_v is not None else self.d_model // self.h

    def validate(self) -> None:
        for name in ("N_enc", "N_dec", "d_model", "d_ff", "h", "vocab_size", "max_len"):
            if getattr(self, name) <= 0:
                raise UserError(f"ModelConfig.{name} must be positive, got {getattr(self, name)}")
        for name in ("d_k", "d_v", "attention_window"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise UserError(f"ModelConfig.{name} must be positive or None, got {value}")
        if (self.d_k is None or self.d_v is None) and self.d_model % self.h:
            raise UserError(
                f"d_model={self.d_model} is not divisible by h={self.h}; "
                "set d_k and d_v explicitly or choose another h"
            )
        if not 0.0 < self.norm_eps < 1.0:
            raise UserError(f"ModelConfig.norm_eps must be in (0, 1), got {self.norm_eps}")
        for name in ("P_drop", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise UserError(f"ModelConfig.{name} must be in [0, 1), got {getattr(self, name)}")
        if not 0 <= self.pad_id < self.vocab_size:
            raise UserError(f"pad_id={self.pad_id} outside the vocabulary of {self.vocab_size}")
        if self.norm not in ("post", "pre"):
            raise UserError(f"norm must be 'post' (paper) or 'pre', got {self.norm!r}")
        if self.activation not in ("relu", "swish", "gelu"):
            raise UserError(
                f"activation must be 'relu' (paper), 'swish' or 'gelu', got {self.activation!r}"
            )
        if self.positional not in ("sinusoidal", "learned", "marian", "fairseq"):
            raise UserError(
                "positional must be 'sinusoidal', 'learned', 'marian' or 'fairseq', "
                f"got {self.positional!r}"
            )

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> ModelConfig:
        """The named preset (see ``PRESETS``), with optional field overrides."""
        if name not in PRESETS:
            raise UserError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}")
        return cls(**{**PRESETS[name].fields, **overrides})


@dataclass(frozen=True)
class Preset:
    """A named configuration: model fields, training overrides and the paper's figures."""

    fields: dict[str, Any]
    train: dict[str, Any] = field(default_factory=dict)  # e.g. label smoothing of row D
    paper_params_m: float | None = None  # "params x1e6" column of Table 3
    note: str = ""


def _row(paper_params_m: float | None = None, train: dict | None = None, **fields: Any) -> Preset:
    return Preset(fields=fields, train=train or {}, paper_params_m=paper_params_m)


# Table 3: unlisted values are as in base. Rows A change h with d_k = d_v = d_model / h.
PRESETS: dict[str, Preset] = {
    "base": _row(65),
    "A-h1": _row(None, h=1, d_k=512, d_v=512),
    "A-h4": _row(None, h=4, d_k=128, d_v=128),
    "A-h16": _row(None, h=16, d_k=32, d_v=32),
    "A-h32": _row(None, h=32, d_k=16, d_v=16),
    "B-dk16": _row(58, d_k=16, d_v=64),
    "B-dk32": _row(60, d_k=32, d_v=64),
    "C-N2": _row(36, N_enc=2, N_dec=2),
    "C-N4": _row(50, N_enc=4, N_dec=4),
    "C-N8": _row(80, N_enc=8, N_dec=8),
    "C-d256": _row(28, d_model=256, d_k=32, d_v=32),
    "C-d1024": _row(168, d_model=1024, d_k=128, d_v=128),
    "C-dff1024": _row(53, d_ff=1024),
    "C-dff4096": _row(90, d_ff=4096),
    "D-drop0.0": _row(None, P_drop=0.0),
    "D-drop0.2": _row(None, P_drop=0.2),
    "D-ls0.0": _row(None, train={"eps_ls": 0.0}),
    "D-ls0.2": _row(None, train={"eps_ls": 0.2}),
    "E-learned": _row(None, positional="learned"),
    # keep_last 20: section 6.1 averages the last 20 checkpoints of the big models.
    "big": _row(
        213,
        train={"max_updates": 300_000, "keep_last": 20},
        d_model=1024,
        d_ff=4096,
        h=16,
        P_drop=0.3,
    ),
    # Table 4: 4 layers, d_model 1024, 16K vocabulary (WSJ only); attention dropout was tuned.
    "parsing": _row(
        None,
        N_enc=4,
        N_dec=4,
        d_model=1024,
        d_ff=4096,
        h=16,
        vocab_size=16000,
        attention_dropout=0.1,
    ),
    # "parsing" sized for a 2-core CPU and the 3,700-tree WSJ sample (aiayn/configs/parsing-sample.yaml).
    "parsing-cpu": _row(
        None,
        N_enc=4,
        N_dec=4,
        d_model=256,
        d_ff=1024,
        h=4,
        vocab_size=4000,
        attention_dropout=0.1,
    ),
    # Students for distillation (aiayn distill, docs/distill.md): a deep encoder, which runs
    # once a sentence, and a shallow decoder, which runs once a token. "student-base" and
    # "student-tiny" are the shapes of Bergamot's students (Bogoychev et al. 2020) with the
    # paper's decoder layers; "student-demo" is the demo model's encoder over one decoder layer.
    "student-base": _row(None, N_enc=6, N_dec=2, d_model=512, d_ff=2048, h=8),
    "student-tiny": _row(None, N_enc=6, N_dec=2, d_model=256, d_ff=1536, h=8),
    "student-demo": _row(None, N_enc=3, N_dec=1, d_model=256, d_ff=1024, h=4, vocab_size=8000),
    # Small presets for a 2-core CPU: "demo" for the bundled corpus, "tiny" for tests.
    "demo": _row(None, N_enc=3, N_dec=3, d_model=256, d_ff=1024, h=4, vocab_size=8000),
    "tiny": _row(None, N_enc=2, N_dec=2, d_model=32, d_ff=64, h=4, vocab_size=100, max_len=256),
}


# ----------------------------------------------------------------------------------------
# Typed construction from plain data: used for saved configs and ``--set key=value``.


def from_dict(cls: type[T], data: dict[str, Any], where: str = "config") -> T:
    """Build dataclass ``cls`` from ``data``, rejecting unknown keys and wrong types."""
    known = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    if not isinstance(data, dict):
        raise UserError(f"{where}: expected a mapping of keys to values, got {data!r}")
    unknown = sorted(set(data) - set(known), key=repr)  # keys of a YAML file need not be strings
    if unknown:
        raise UserError(f"{where}: unknown key(s) {unknown}; valid keys: {sorted(known)}")
    hints = typing.get_type_hints(cls)
    checked = {key: _check(value, hints[key], f"{where}: {key}") for key, value in data.items()}
    try:
        return cls(**checked)
    except ValueError as e:  # a range check of the dataclass: say where the value came from
        raise UserError(f"{where}: {e}") from None


def to_dict(obj: Any) -> dict[str, Any]:
    return dataclasses.asdict(obj)


def parse_assignments(cls: type, assignments: list[str], where: str = "--set") -> dict[str, Any]:
    """``{key: value}`` of ``key=value`` strings, each value read as the type of field ``key`` of
    dataclass ``cls``; a key given twice keeps its last value."""
    hints = typing.get_type_hints(cls)
    changes: dict[str, Any] = {}
    for item in assignments:
        key, sep, text = item.partition("=")
        if not sep:
            raise UserError(f"{where}: expected key=value, got {item!r}")
        key = key.strip()
        if key not in hints:
            raise UserError(f"{where}: unknown key {key!r}; valid keys: {sorted(hints)}")
        changes[key] = _parse(text.strip(), hints[key], f"{where} {key}")
    return changes


def with_overrides(obj: T, assignments: list[str], where: str = "--set") -> T:
    """Return a copy of dataclass ``obj`` with ``key=value`` strings applied (typed)."""
    changes = parse_assignments(type(obj), assignments, where)
    try:
        return dataclasses.replace(obj, **changes)  # type: ignore[type-var]
    except ValueError as e:
        raise UserError(f"{where}: {e}") from None


def _options(tp: Any) -> tuple[Any, ...]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return typing.get_args(tp)
    return (tp,)


def _check(value: Any, tp: Any, where: str) -> Any:
    for option in _options(tp):
        if option is type(None) and value is None:
            return None
        if typing.get_origin(option) is Literal and value in typing.get_args(option):
            return value
        if option is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                return float(value)
            except OverflowError:  # an int too large for a float
                continue
        if option is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if option in (bool, str) and isinstance(value, option):
            return value
        if typing.get_origin(option) is list and isinstance(value, list):
            return value
        if typing.get_origin(option) is dict and isinstance(value, dict):
            return value
    raise UserError(f"{where}: expected {_name(tp)}, got {value!r}")


def _parse(text: str, tp: Any, where: str) -> Any:
    for option in _options(tp):
        if option is type(None) and text.lower() in ("none", "null"):
            return None
        if typing.get_origin(option) is Literal and text in typing.get_args(option):
            return text
        if option is bool and text.lower() in ("true", "false", "1", "0", "yes", "no"):
            return text.lower() in ("true", "1", "yes")
        if option in (int, float):
            try:
                return option(text)
            except ValueError:
                continue
        if option is str:
            return text
    raise UserError(f"{where}: cannot read {text!r} as {_name(tp)}")


def _name(tp: Any) -> str:
    return " or ".join(
        "None"
        if o is type(None)
        else (
            repr(typing.get_args(o))
            if typing.get_origin(o) is Literal
            else getattr(o, "__name__", str(o))
        )
        for o in _options(tp)
    )
