"""BLEU two ways: SacreBLEU (comparable, with a signature) and the paper's tokenised BLEU.

The paper's numbers (Table 2) are tensor2tensor's ``get_ende_bleu.sh``: the output is
Moses-tokenised, hyphenated compounds are split as GNMT and ConvS2S did
(``rich-text`` -> ``rich ##AT##-##AT## text``), and ``multi-bleu.perl`` scores the result
against the reference treated the same way. Tokenised BLEU is typically higher than SacreBLEU
and is not comparable across tokenisations; report both.

multi-bleu.perl is case-sensitive corpus BLEU on whitespace tokens: clipped n-gram precisions
p_1..p_4 with no smoothing (any p_n = 0 gives 0), brevity penalty exp(1 - r/c) when c < r, with
r the sum of the reference lengths closest to each hypothesis (ties: the shorter). SacreBLEU's
BLEU with ``tokenize="none"`` and ``smooth_method="none"`` computes exactly this, which
``tests/test_bleu.py`` checks against a hand-computed example.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

from sacrebleu.metrics import BLEU

References = Sequence[str] | Sequence[Sequence[str]]

_COMPOUND = re.compile(r"(\S)-(\S)")


def _streams(refs: References) -> list[list[str]]:
    """One reference per hypothesis (list of str), or several streams (list of lists of str)."""
    if refs and isinstance(refs[0], str):
        return [list(refs)]  # type: ignore[arg-type]
    return [list(stream) for stream in refs]


def sacre_bleu(hyps: Sequence[str], refs: References, **bleu_args) -> tuple[float, str]:
    """Detokenised hypotheses and references -> (BLEU, SacreBLEU signature).

    Defaults are SacreBLEU's (13a tokenisation, exp smoothing); ``bleu_args`` go to ``BLEU``.
    """
    metric = BLEU(**bleu_args)
    score = metric.corpus_score(list(hyps), _streams(refs))
    return score.score, str(metric.get_signature())


@lru_cache(maxsize=8)
def _moses(lang: str):
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    return MosesTokenizer(lang=lang), MosesPunctNormalizer(lang=lang)


def moses_tokenize(line: str, lang: str = "de", replace_unicode_punct: bool = False) -> str:
    """tokenizer.perl -l lang (default escaping of & < > ' " as tokenizer.perl does)."""
    tokenizer, normalizer = _moses(lang)
    if replace_unicode_punct:
        line = normalizer.replace_unicode_punct(line)
    return tokenizer.tokenize(line, return_str=True, escape=True)


def atat_split(line: str) -> str:
    """get_ende_bleu.sh's ``s{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g`` (non-overlapping, as Perl)."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", line)


def multi_bleu(hyps: Sequence[str], refs: References) -> float:
    """multi-bleu.perl on already tokenised text (whitespace tokens, case-sensitive)."""
    metric = BLEU(tokenize="none", smooth_method="none", force=True)
    return metric.corpus_score(list(hyps), _streams(refs)).score


def paper_bleu(
    hyps: Sequence[str], refs: References, lang: str = "de", compound_split: bool = True
) -> float:
    """The paper's tokenised BLEU (get_ende_bleu.sh): Moses-tokenise, split compounds, multi-bleu.

    As in the script, Unicode punctuation is normalised (replace-unicode-punctuation.perl) in
    the hypotheses only; the references are tokenised as they are.
    """

    def prepare(line: str, replace: bool) -> str:
        line = moses_tokenize(line, lang, replace_unicode_punct=replace)
        return atat_split(line) if compound_split else line

    hyps_tok = [prepare(h, True) for h in hyps]
    refs_tok = [[prepare(r, False) for r in stream] for stream in _streams(refs)]
    return multi_bleu(hyps_tok, refs_tok)


__all__ = ["atat_split", "moses_tokenize", "multi_bleu", "paper_bleu", "sacre_bleu"]
