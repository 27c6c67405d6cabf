"""``split``, ``markup`` and ``placeholders`` of ``POST /translate`` (``aiayn.text``, as
``translate --split`` / ``--markup`` / ``--placeholders`` do them): the request's texts are
rewritten before decoding (sentences; plain texts with alignments asked for) and the answers
put back together after (one per text: joined sentences; tags and placeholders put back).

An answer is made of pieces, each ready once the decoded items it needs are: an item's
answer, or with ``split`` one sentence's, with what it adds to its text (``delta``). A streamed
answer sends each piece as a line as soon as it is ready; the whole answer is the same pieces
put together, so the two agree byte for byte."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import UserError
from ..text.document import around_spans, split_line, trained_limit
from ..text.markup import put_back, take_apart
from ..text.placeholders import placeholder_pattern

Answers = list[dict[str, Any]]


@dataclass(frozen=True)
class Piece:
    """Item ``index``'s answer; with ``split``, sentence ``sentence`` of it (None: a text with
    no sentence) and ``delta``, what it adds to the item's text."""

    index: int
    answer: dict[str, Any] | None
    sentence: int | None = None
    delta: str | None = None

    def line(self) -> dict[str, Any]:
        """The piece as a line of a streamed answer."""
        head: dict[str, Any] = {"index": self.index}
        if self.delta is not None:
            head |= {"sentence": self.sentence, "delta": self.delta}
        return head | (self.answer or {})


# how many decoded items a piece needs, and how it is made of the answers
Step = tuple[int, Callable[[Answers], Piece]]


@dataclass
class TextRequest:
    """The request as decoded (``body``), and how its answers become the client's: its pieces
    in order (``steps``) and the whole answer made of them (``whole``)."""

    body: Any  # TranslateRequest
    steps: list[Step]
    whole: Callable[[list[Piece]], Answers]

    def ready(self, answers: Answers, start: int) -> list[Piece]:
        """The pieces from ``start`` on that ``answers`` (the first items' answers) make."""
        end = start
        while end < len(self.steps) and self.steps[end][0] <= len(answers):
            end += 1
        return [make(answers) for _, make in self.steps[start:end]]

    def finish(self, answers: Answers) -> Answers:
        """The whole answer (``answers``: every item's)."""
        return self.whole(self.ready(answers, 0))


def text_request(body: Any, translator: Any) -> TextRequest:
    """The request as it is decoded, and its pieces (``UserError`` for what the options cannot
    be combined with: they give the best text of each item)."""
    if not (body.split or body.markup or body.placeholders):
        return TextRequest(body, [_item(i, None) for i in range(len(body.text))], _answers)
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


def _item(i: int, finish: Callable[[dict[str, Any]], dict[str, Any]] | None) -> Step:
    """Item ``i``'s answer (through ``finish``) as a piece."""
    return i + 1, lambda answers: Piece(i, finish(answers[i]) if finish else answers[i])


def _answers(pieces: list[Piece]) -> Answers:
    return [p.answer for p in pieces if p.answer is not None]


def _split(body: Any, translator: Any) -> TextRequest:
    lang = translator.meta.get("dataset", {}).get("record", {}).get("src_lang", "en")
    limit = trained_limit(translator.meta) if translator.meta else translator.max_source_tokens
    count = lambda s: len(translator.encode([s])[0])  # noqa: E731
    spans = [
        split_line(t, lang, count, limit, where=f"text[{i}]")[0] for i, t in enumerate(body.text)
    ]
    steps: list[Step] = []
    k = 0  # the sentences of the texts before
    for i, (text, line) in enumerate(zip(body.text, spans)):
        if not line:  # a text with no sentence: ready once those before it are
            steps.append((k, _blank(i, text)))
        for j, (before, after) in enumerate(around_spans(text, line)):
            steps.append((k + 1, _sentence(i, j, k, before, after)))
            k += 1
    sentences = [t[a:b] for t, s in zip(body.text, spans) for a, b in s]
    # a request of blank texts still decodes one (empty) item: the batcher takes no empty job
    return TextRequest(body.model_copy(update={"text": sentences or [""]}), steps, _documents)


def _blank(i: int, text: str) -> Callable[[Answers], Piece]:
    """Text ``i``, which holds no sentence, as a piece: the text as it is."""
    return lambda _: Piece(i, None, None, text)


def _sentence(i: int, j: int, k: int, before: str, after: str) -> Callable[[Answers], Piece]:
    """Sentence ``j`` of text ``i``, the request's ``k``th, as a piece."""
    return lambda answers: Piece(i, answers[k], j, before + answers[k]["text"] + after)


def _documents(pieces: list[Piece]) -> Answers:
    """Each text's answer: its pieces' deltas joined, and its sentences' answers."""
    out: Answers = []
    for p in pieces:
        if p.index == len(out):
            out.append({"text": "", "sentences": []})
        out[p.index]["text"] += p.delta
        if p.answer is not None:
            out[p.index]["sentences"].append(p.answer)
    return out


def _marked(body: Any) -> TextRequest:
    pattern = placeholder_pattern(markup=body.markup is not None, built_in=body.placeholders)
    marked = [take_apart(t, pattern, html=body.markup == "html") for t in body.text]
    markup = body.markup is not None

    def finish(m: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
        def put(answer: dict[str, Any]) -> dict[str, Any]:
            found = (p.split("-") for p in (answer.pop("alignment") or "").split())
            pairs = [(int(i), int(j)) for i, j in found]
            for item in answer["nbest"]:
                item.pop("alignment", None)
            answer["text"] = put_back(m, answer["text"], pairs, markup=markup)
            answer["nbest"][:1] = (
                [{**answer["nbest"][0], "text": answer["text"]}] if answer["nbest"] else []
            )
            return answer

        return put

    steps = [_item(i, finish(m)) for i, m in enumerate(marked)]
    text = [m.source for m in marked]
    return TextRequest(body.model_copy(update={"text": text, "alignments": True}), steps, _answers)
