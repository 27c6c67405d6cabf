"""What an engine can be asked beyond the paper's beam search, named once: each ``Feature``'s
reason, and the ``aiayn.Translator`` keyword and server request field that ask for it, so that
``aiayn.Translator`` refuses through one function (``check_supported``) with one wording for
every entry point, each naming what its user typed (``Spelling``: the keyword, the command
line's option, the server's field).

One vocabulary: a decoding option's command-line name is its Translator keyword with dashes
(``option_name``), the three exceptions kept for users' scripts in ``OPTION_NAMES``.

Engines declare the features they support (``TorchEngine.supports``: all of them;
``CTranslate2Engine.supports``: prefixes and sampling; ``OnnxEngine.supports``: all but what
only our model in torch has); every caller builds the features it asks for, named its own way,
and ``check_supported`` refuses those the engine lacks, each reason said of the engine in use
(``Capability.why``: a reason names an engine only where that engine is why):

    check_supported({"lexical_constraints": "--constraints"}, "ctranslate2", supports,
                    instead="--engine torch")
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Literal

from ..errors import UserError

Feature = Literal[
    "ensemble",
    "quantize",
    "precision",  # bf16: another engine decodes in its own float32
    "lexical_constraints",
    "glossary",  # its terms become lexical constraints (``text.glossary``)
    "prefixes",
    "max_src_len",
    "min_len",
    "sampling",
    "seed",
    "shortlist",
    "search_rules",  # another toolkit's (``rules.SEARCH_RULES``)
    "no_repeat_ngram",  # DecodeConfig.no_repeat_ngram_size (``repetition.py``)
    "repetition_penalty",  # DecodeConfig.repetition_penalty, on log-probabilities
    "token_scores",
    "alignments",
]
ALL_FEATURES: frozenset[Feature] = frozenset(Feature.__args__)  # type: ignore[attr-defined]

# The engines (``--engine``) other than ours as their makers write them, for refusals' reasons.
ENGINE_NAMES = {"ctranslate2": "CTranslate2", "onnxruntime": "ONNX Runtime"}


# The command-line options not named ``--`` + keyword with dashes: older names, kept.
OPTION_NAMES = {"rules": "--search-rules", "preset": "--decode-preset", "prefixes": "--prefix"}


def option_name(keyword: str) -> str:
    """The command-line option of an ``aiayn.Translator`` / ``Translator.request`` keyword."""
    return OPTION_NAMES.get(keyword, "--" + keyword.replace("_", "-"))


@dataclass(frozen=True)
class Capability:
    """Why a feature is our search's, and who asks for it: ``keyword`` of ``aiayn.Translator``
    or its ``request``/``translate`` (None: only a ``SearchRequest`` asks it; the command
    line's option is ``option_name(keyword)``), ``field`` in the server's ``POST /translate``
    body (None: the server does not ask it per request, or answers it with our model whatever
    the engine, as alignments)."""

    reason: str
    keyword: str | None = None
    field: str | None = None
    engines: Mapping[str, str] = dataclass_field(default_factory=dict)

    @property
    def option(self) -> str | None:
        return None if self.keyword is None else option_name(self.keyword)

    def why(self, engine: str) -> str:
        """The reason ``engine`` (an ``--engine`` value) refuses it: its own where it has one
        (``engines``), else ``reason``, ``{engine}`` there its name as its makers write it."""
        reason = self.engines.get(engine, self.reason)
        return reason.format(engine=ENGINE_NAMES.get(engine, engine))


@dataclass(frozen=True)
class Spelling:
    """How an entry point's user named the options, so that a refusal names what they typed:
    ``name`` of a keyword, and ``instead``, what does every feature; ``values``: a choice is
    named with the value given (``--search-rules ct2``), as a command line reads."""

    name: Callable[[str], str]
    instead: str
    values: bool = False

    def feature(self, feature: Feature, value: object = None) -> str:
        """A feature as this user asked for it (its keyword's name; else the feature)."""
        keyword = CAPABILITIES[feature].keyword
        named = feature if keyword is None else self.name(keyword)
        return f"{named} {value}" if self.values and value is not None else named


def _field(keyword: str) -> str:
    """A keyword as the server's request body names it (``POST /translate``)."""
    fields = {c.keyword: c.field for c in CAPABILITIES.values() if c.field and c.keyword}
    return {**fields, "sample": '"sample"'}.get(keyword, keyword)


CTRANSLATE2 = "ctranslate2"
CAPABILITIES: dict[Feature, Capability] = {
    "ensemble": Capability("it decodes one checkpoint, not an ensemble", "checkpoint"),
    "quantize": Capability(
        "our int8 is not {engine}'s",
        "quantize",
        engines={"onnxruntime": "our int8 is not ONNX Runtime's: export with --quantization int8"},
    ),
    "precision": Capability("it decodes in float32", "precision"),
    "lexical_constraints": Capability(
        "lexical constraints are our search's",
        "constraints",
        "constraints",
        engines={CTRANSLATE2: "CTranslate2 has target prefixes but no lexical constraints"},
    ),
    "glossary": Capability(
        "its terms become lexical constraints, which are our search's", "glossary", "glossary"
    ),
    "prefixes": Capability("a target prefix is our search's", "prefixes", "prefix"),
    "max_src_len": Capability("cutting sources shorter than the model's positions is ours"),
    "min_len": Capability("a minimum output length is our search's"),
    "sampling": Capability("drawing outputs is our search's", "sample", "sample"),
    "seed": Capability(
        "a seeded sampler is our search's",
        "seed",
        "seed",
        engines={
            CTRANSLATE2: "CTranslate2 seeds its sampler once per process: samples differ each run"
        },
    ),
    "shortlist": Capability(
        "it slices our model's output layer, which {engine}'s graph holds whole",
        "shortlist",
        engines={CTRANSLATE2: "it is our search's (CTranslate2 has its own vocabulary map)"},
    ),
    "search_rules": Capability(
        "it runs the paper's search; ours follows every rule", "rules", "search_rules"
    ),
    "no_repeat_ngram": Capability(
        "the repetition guards are our search's",
        "no_repeat_ngram_size",
        "no_repeat_ngram_size",
        engines={
            CTRANSLATE2: "CTranslate2 bans on the logits and renormalises; ours and transformers' do not"
        },
    ),
    "repetition_penalty": Capability(
        "the repetition guards are our search's",
        "repetition_penalty",
        "repetition_penalty",
        engines={
            CTRANSLATE2: "CTranslate2 applies it to logits, ours to log-probabilities as "
            "transformers' beam does"
        },
    ),
    "token_scores": Capability("they come from our model's forced decoding", "token_scores"),
    "alignments": Capability("they come from our model's attention", "alignments"),
}


def check_supported(
    asked: Mapping[Feature, str] | Iterable[Feature],
    engine: str,
    supports: frozenset[Feature],
    *,
    where: Mapping[Feature, str] | None = None,
    instead: str = "our search (engine torch)",
) -> None:
    """The one refusal: ``UserError`` in one line naming all that ``asked`` wants and
    ``engine`` does not ``supports``, each as the caller names it (its values; the feature's
    own name for a set) with its reason for this engine (``Capability.why``), prefixed by the
    ``where`` of the first that has one (a file's line, a request's item); ``instead`` is what
    does them all."""
    names = dict(asked) if isinstance(asked, Mapping) else {f: f for f in asked}
    missing = [f for f in CAPABILITIES if f in names and f not in supports]
    if missing:
        place, items = _items(names, {f: CAPABILITIES[f].why(engine) for f in missing}, where)
        raise UserError(f"{place}the {engine} engine cannot do: {items}; {instead} does every one")


def check_text(
    asked: Mapping[Feature, str] | Iterable[Feature],
    kind: str,
    lacks: Mapping[str, str],
    *,
    where: Mapping[Feature, str] | None = None,
) -> None:
    """``check_supported``'s refusal for what a checkpoint's text splitting ``kind`` cannot
    do whatever the engine (``lacks``: a feature's reason; ``data.pieces.text_limits``)."""
    names = dict(asked) if isinstance(asked, Mapping) else {f: f for f in asked}
    missing = {f: lacks[f] for f in CAPABILITIES if f in names and f in lacks}
    if missing:
        place, items = _items(names, missing, where)
        raise UserError(f"{place}the checkpoint's text splitting ({kind}) cannot do: {items}")


def _items(
    names: Mapping[Feature, str],
    reasons: Mapping[Feature, str],
    where: Mapping[Feature, str] | None,
) -> tuple[str, str]:
    """The ``where`` of the first refused feature that has one (a file's line, a request's
    item) and the features refused, each named with its reason."""
    place = next((where[f] for f in reasons if where and f in where), None)
    items = "; ".join(f"{names[f]} ({reason})" for f, reason in reasons.items())
    return f"{place}: " if place else "", items


# Python's keywords, the command line's options, the server's fields.
PYTHON = Spelling(lambda keyword: keyword, "engine='torch'")
COMMAND_LINE = Spelling(option_name, "--engine torch", values=True)
SERVER = Spelling(_field, "the server's own search (without --engine)")
