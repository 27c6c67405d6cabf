"""``split``, ``markup`` and ``placeholders`` of ``POST /translate`` (``aiayn.text``, as
``translate --split`` / ``--markup`` / ``--placeholders`` do them): the request's texts are
rewritten before decoding (sentences; plain texts with alignments asked for) and the answers
put back together after (one per text: joined sentences; tags and placeholders put back)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import UserError
from ..text.document import join_line, split_line, trained_limit
from ..text.markup import put_back, take_apart
from ..text.placeholders import placeholder_pattern

Answers = list[dict[str, Any]]


@dataclass
class TextRequest:
    """The request as decoded (``body``), and what makes its answers the client's."""

    body: Any  # TranslateRequest
    finish: Callable[[Answers], Answers]


def text_request(body: Any, translator: Any) -> TextRequest | None:
    """None for a plain request; else the rewritten one (``UserError`` for what the options
    cannot be combined with: they give the best text of each item)."""
    if not (body.split or body.markup or body.placeholders):
        return None
    others = [name for name in ("prefix", "constraints") if getattr(body, name) is not None]
    others += [name for name in ("sample", "attention", "alignments") if getattr(body, name)]
    if body.nbest > 1 or others or (body.split and (body.markup or body.placeholders)):
        raise UserError(
            "split, markup and placeholders give the best text of each item: one at a time, "
            "not with nbest > 1, sample, attention, alignments, prefix or constraints"
        )
    if body.split:
        return _split(body, translator)
    return _marked(body)


def _split(body: Any, translator: Any) -> TextRequest:
    lang = translator.meta.get("dataset", {}).get("record", {}).get("src_lang", "en")
    limit = trained_limit(translator.meta) if translator.meta else translator.max_source_tokens
    count = lambda s: len(translator.encode([s])[0])  # noqa: E731
    spans = [
        split_line(t, lang, count, limit, where=f"text[{i}]")[0] for i, t in enumerate(body.text)
    ]
    sentences = [t[a:b] for t, s in zip(body.text, spans) for a, b in s]

    def finish(answers: Answers) -> Answers:
        out, at = [], 0
        for text, line in zip(body.text, spans):
            mine, at = answers[at : at + len(line)], at + len(line)
            out.append(
                {"text": join_line(text, line, [a["text"] for a in mine]), "sentences": mine}
            )
        return out

    # a request of blank texts still decodes one (empty) item: the batcher takes no empty job
    return TextRequest(body.model_copy(update={"text": sentences or [""]}), finish)


def _marked(body: Any) -> TextRequest:
    pattern = placeholder_pattern(markup=body.markup is not None, built_in=body.placeholders)
    marked = [take_apart(t, pattern, html=body.markup == "html") for t in body.text]

    def finish(answers: Answers) -> Answers:
        for m, answer in zip(marked, answers):
            found = (p.split("-") for p in (answer.pop("alignment") or "").split())
            pairs = [(int(i), int(j)) for i, j in found]
            for item in answer["nbest"]:
                item.pop("alignment", None)
            answer["text"] = put_back(m, answer["text"], pairs, markup=body.markup is not None)
            answer["nbest"][:1] = (
                [{**answer["nbest"][0], "text": answer["text"]}] if answer["nbest"] else []
            )
        return answers

    text = [m.source for m in marked]
    return TextRequest(body.model_copy(update={"text": text, "alignments": True}), finish)
