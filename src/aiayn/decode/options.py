"""Each decoding option checked once, by the keyword that names it everywhere (the command
line's option is the keyword with dashes, ``capabilities.option_name``): the checks that
``aiayn.Translator.request`` and ``translate`` run for the command line, Python and the server
alike, each message naming the option as its caller's user typed it (``say``: a
``capabilities.Spelling``'s ``name``), so that no entry point keeps checks of its own."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from ..errors import UserError, UserTypeError
from .capabilities import Feature
from .request import Batching
from .sample import SampleConfig


def sampling(
    say: Callable[[str], str],
    sample: SampleConfig | bool | None,
    beam: int | None,
    nbest: int | None,
    rules: str,
    drawing: dict[str, Any],
) -> SampleConfig | None:
    """The draw ``sample`` asks for (``nbest`` samples per source; ``drawing``: its top_k,
    top_p, temperature and seed where given), or None: beam search."""
    given = {k: v for k, v in drawing.items() if v is not None}
    if sample is not None and not isinstance(sample, (bool, SampleConfig)):
        raise UserTypeError(
            f"{say('sample')} must be True, False or a SampleConfig, not {sample!r} "
            f"({type(sample).__name__})"
        )
    if not sample:
        if given:
            raise UserError(f"{say(next(iter(given)))} needs {say('sample')}")
        return None
    if beam is not None:
        raise UserError(
            f"{say('beam')} has no effect with {say('sample')} ({say('nbest')} N: N samples "
            "per source)"
        )
    if rules != "paper":
        raise UserError(f"{say('rules')} {rules} is a beam search's; {say('sample')} draws")
    drawn = SampleConfig(**given) if sample is True else replace(sample, **given)
    return replace(drawn, samples=nbest) if nbest is not None else drawn


def shortlist_sizes(
    say: Callable[[str], str],
    shortlist: Any,
    drawn: SampleConfig | None,
    frequent: int | None,
    best: int | None,
) -> dict[str, int]:
    """The sizes a shortlist is cut to (those not given keep the library's defaults)."""
    sizes = {"frequent": frequent, "best": best}
    chosen = {k: v for k, v in sizes.items() if v is not None}
    if shortlist is None:
        if chosen:
            key = next(iter(chosen))
            raise UserError(
                f"{say('shortlist_' + key)} sizes a shortlist: give {say('shortlist')} FILE too"
            )
        return {}
    if drawn is not None:
        raise UserError(
            f"{say('shortlist')} restricts the beam search; {say('sample')} draws from every piece"
        )
    for key, value in chosen.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise UserError(f"{say('shortlist_' + key)} must be at least 0, got {value!r}")
    if chosen == {"frequent": 0, "best": 0}:
        raise UserError(
            f"{say('shortlist_frequent')} 0 and {say('shortlist_best')} 0 leave only the special "
            "pieces: every output would be empty; give either at least 1"
        )
    return chosen


def per_sentence(
    say: Callable[[str], str], shortlist: Any, prefixes: Any, constraints: Any, glossary: Any = None
) -> set[Feature]:
    """What the sentences will come with (``request``'s ``prefixes`` and ``constraints``, and
    a glossary's terms), refused with a shortlist, which renumbers the pieces."""
    given: dict[Feature, Any] = {"prefixes": prefixes, "lexical_constraints": constraints}
    per_sentence: set[Feature] = {f for f, v in given.items() if v not in (None, False)}
    if shortlist is not None and (per_sentence or glossary is not None):
        keywords = {"prefixes": "prefixes", "lexical_constraints": "constraints"}
        first = next((keywords[f] for f in keywords if f in per_sentence), "glossary")
        raise UserError(
            f"{say('shortlist')} and {say(first)} cannot be combined (a shortlist renumbers "
            "the pieces the search sees)"
        )
    return per_sentence


def batching(
    say: Callable[[str], str], batch_size: int | None, max_tokens: int | None, workers: int
) -> Batching:
    """``batch_size`` and ``max_tokens``, each at least 1, those not given keeping the one
    batching policy's defaults (``decode.request.Batching``), for ``workers``."""
    given = {k: v for k, v in (("batch_size", batch_size), ("max_tokens", max_tokens))}
    given = {k: v for k, v in given.items() if v is not None}
    for key, value in given.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserError(f"{say(key)} must be at least 1, got {value!r}")
    return Batching(**given, workers=workers)


def target_lang(
    say: Callable[[str], str], code: Any, codes: Sequence[str], model: object
) -> str | None:
    """``code`` when ``model`` has its language token (``codes``: its languages, from its
    vocabulary's ``>>xx<<`` pieces); None when none is asked for."""
    if code is None:
        return None
    if not isinstance(code, str):
        raise UserTypeError(f"{say('target_lang')} must be a str, not {type(code).__name__}")
    if not codes:
        raise UserError(
            f"{say('target_lang')} {code}: {model} has no target-language tokens (>>xx<< "
            "pieces): it translates into one language"
        )
    if code not in codes:
        raise UserError(f"{say('target_lang')} {code}: {model} translates into {', '.join(codes)}")
    return code


def alignment_layer(alignments: bool | int) -> int | None:
    if alignments is False or alignments is None:
        return None
    if alignments is True:
        return -1
    if not isinstance(alignments, int):
        raise UserTypeError(
            f"alignments must be True, False or a decoder layer's number, not {alignments!r}"
        )
    return alignments


def check_per_sentence(given: Any, name: str, sentences: int) -> None:
    """A per-sentence list checked as ``sentences`` is (``check_sentences``): one str would
    be taken one character a sentence."""
    if isinstance(given, (str, bytes)):
        raise UserTypeError(
            f"{name} must be a list with one item per sentence, not one "
            f"{type(given).__name__}: give [{name[:-1] if name == 'prefixes' else 'phrases'}] "
            "for one sentence"
        )
    if not isinstance(given, Sequence):
        raise UserTypeError(
            f"{name} must be a list, one item per sentence, not {type(given).__name__}"
        )
    if len(given) != sentences:
        raise UserError(f"{len(given)} {name} for {sentences} sentences: give one each")
    if name == "prefixes":
        for i, prefix in enumerate(given):
            if not isinstance(prefix, str):
                raise UserTypeError(f"prefixes[{i}] is {type(prefix).__name__}, not str")


def phrases(given: Sequence[str] | str, i: int) -> list[str]:
    """Sentence i's phrases: a list of str, or one str (one phrase, not its characters)."""
    phrases = [given] if isinstance(given, str) else given
    if not isinstance(phrases, Sequence) or isinstance(phrases, bytes):
        raise UserTypeError(f"constraints[{i}] is {type(given).__name__}, not a list of str")
    for j, phrase in enumerate(phrases):
        if not isinstance(phrase, str):
            raise UserTypeError(f"constraints[{i}][{j}] is {type(phrase).__name__}, not str")
    return list(phrases)
