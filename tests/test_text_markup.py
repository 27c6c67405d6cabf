"""Markup and placeholders through a translation (``aiayn.text.markup``, ``--markup``,
``--placeholders``): what was taken out comes back verbatim, tags around the aligned words,
and the output is well formed, on 360 software-like strings through the tiny model."""

import random
import re
from collections import Counter

import pytest
from _cli import run_cli

from aiayn.checkpoint import latest_checkpoint, load_translator
from aiayn.decode import DecodeConfig, SearchRequest
from aiayn.errors import UserError
from aiayn.text.marked import MarkupOutputs
from aiayn.text.markup import put_back, take_apart, well_formed
from aiayn.text.placeholders import BUILT_IN, placeholder_pattern

WORDS = (
    "the file was saved open your account settings now delete all messages from this folder".split()
)
PLACEHOLDERS = {
    "printf": ["%s", "%d", "%1$s", "%2$d", "%-5.2f", "%@", "%%"],
    "python": ["%(name)s", "%(count)d"],
    "braces": ["{name}", "{0}", "{count}", "{{user}}", "{user.email}"],
    "url": [
        "https://example.com/help",
        "http://a.example.org/x?id=3&amp;y=4",
        "https://ex.io/a/b.html",
    ],
    "email": ["support@example.com", "a.b+c@mail.example.org"],
    "number": ["3", "42", "1,000", "2.5", "10.000,50"],
    "entity": ["&amp;", "&lt;", "&gt;", "&quot;", "&#39;", "&#x2014;"],
}
TAGS = [
    ("<b>", "</b>"),
    ("<i>", "</i>"),
    ('<a href="https://example.com/x?a=1">', "</a>"),
    ('<span class="warn">', "</span>"),
    ("<strong>", "</strong>"),
]
EMPTY = ["<br/>", '<img src="icon.png"/>', "<!-- note -->"]


def software_strings(n: int = 360, seed: int = 0) -> list[str]:
    """``n`` well-formed XML strings: words with placeholders of every kind, tags, nested
    tags, self-closing tags, URLs and entities, some with spaces around."""
    rng = random.Random(seed)
    kinds = list(PLACEHOLDERS)

    def phrase(depth: int) -> str:
        parts = []
        for _ in range(rng.randint(2, 6)):
            r = rng.random()
            if r < 0.45:
                parts.append(rng.choice(WORDS))
            elif r < 0.75:
                parts.append(rng.choice(PLACEHOLDERS[rng.choice(kinds)]))
            elif r < 0.9 and depth < 2:
                open_, close = rng.choice(TAGS)
                parts.append(f"{open_}{phrase(depth + 1)}{close}")
            else:
                parts.append(rng.choice(EMPTY))
        return " ".join(parts)

    out = []
    for i in range(n):
        kind = kinds[i % len(kinds)]  # every kind in every seventh string at least
        s = f"{phrase(0)} {rng.choice(PLACEHOLDERS[kind])} {phrase(0)}"
        if i % 5 == 0:
            s = f"  {s}."
        out.append(s)
    return out


PATTERN = placeholder_pattern(markup=True, built_in=True)


def _kept(source: str) -> Counter:
    """What must come back verbatim: every placeholder and tag of ``source``."""
    return Counter(m.group() for m in PATTERN.finditer(source))


@pytest.fixture(scope="module")
def tiny(tiny_run):
    ckpt = latest_checkpoint(tiny_run / "checkpoints")
    return ckpt, *load_translator(ckpt)


@pytest.mark.slow
def test_every_placeholder_verbatim_and_every_output_well_formed(tiny, one_thread):
    _, model, vocab = tiny
    strings = software_strings()
    assert all(well_formed(s, "xml") for s in strings)
    for kind, examples in PLACEHOLDERS.items():  # each kind is in the set, found as one piece
        assert any(e in s for s in strings for e in examples), kind
        assert all(PATTERN.fullmatch(e) for e in examples), kind
    request = SearchRequest(DecodeConfig.preset("translation", beam=2))
    outs = MarkupOutputs("xml", PATTERN)(
        model, strings, vocab, request, progress=False, on_truncate=None
    )
    assert len(outs) == len(strings) >= 300
    for source, out in zip(strings, outs):
        assert not (_kept(source) - _kept(out)), (source, out)  # nothing lost or changed
        assert well_formed(out, "xml"), (source, out)
        assert out[: len(out) - len(out.lstrip())] == source[: len(source) - len(source.lstrip())]
    urls = [u for s in strings for u in re.findall(BUILT_IN["url"], s)]
    assert len(urls) > 50 and all(any(u in o for o in outs) for u in urls)


def test_tags_wrap_the_words_aligned_to_those_they_wrapped():
    marked = take_apart("Click <b>here</b> to save %s now", PATTERN)
    assert marked.source == "Click here to save now"
    # target "Guarde ahora haciendo clic aquí": here -> aquí, save -> Guarde, now -> ahora
    pairs = [(3, 0), (4, 1), (0, 2), (0, 3), (1, 4)]
    out = put_back(marked, "Guarde ahora haciendo clic aquí", pairs, markup=True)
    assert out == "Guarde %s ahora haciendo clic <b>aquí</b>"


def test_nested_and_crossing_projections_stay_well_formed():
    marked = take_apart("<a href='x'><b>one</b> two</a> <i>three</i>", PATTERN)
    # the aligner crosses them: one -> 2, two -> 0, three -> 1
    out = put_back(marked, "uno dos tres", [(1, 0), (2, 1), (0, 2)], markup=True)
    assert well_formed(out, "xml") and out.count("<b>") == out.count("</b>") == 1
    assert out == "<a href='x'>uno dos <b>tres</b></a> <i></i>"


def test_the_models_own_markup_characters_are_escaped():
    marked = take_apart("<b>a</b>", PATTERN)
    assert put_back(marked, "x < y & z", [(0, 0)], markup=True) == "<b>x</b> &lt; y &amp; z"
    plain = take_apart("%s a", placeholder_pattern(markup=False, built_in=True))
    assert put_back(plain, "x < y", [(0, 0)], markup=False) == "%s x < y"


def test_unpaired_tags_are_kept_as_placeholders():
    marked = take_apart("a </b> c <i> d", PATTERN)
    assert marked.source == "a c d"
    out = put_back(marked, "A C D", [(0, 0), (1, 1), (2, 2)], markup=True)
    assert out == "A </b> C <i> D"


def test_html_void_elements_need_no_close():
    pattern = placeholder_pattern(markup=True, built_in=False)
    marked = take_apart("line one<br>line <b>two</b>", pattern, html=True)
    out = put_back(marked, "l1 o l2 t", [(0, 0), (1, 1), (2, 2), (3, 3)], markup=True)
    assert out == "l1 o<br>l2 <b>t</b>" and well_formed(out, "html")  # glued as it was
    assert not well_formed("<b>x</i>", "html") and not well_formed("<b>x", "xml")


def test_a_user_pattern_comes_first_and_a_bad_one_is_refused():
    pattern = placeholder_pattern(markup=False, built_in=True, user=(r"\$\w+",))
    assert take_apart("pay $amount now", pattern).source == "pay now"
    with pytest.raises(UserError, match=r"--placeholder-pattern '\(': "):
        placeholder_pattern(markup=False, built_in=True, user=("(",))


def test_translate_markup_on_the_command_line(tiny, tmp_path, capsys):
    src = tmp_path / "strings.txt"
    strings = software_strings(12, seed=1)
    src.write_text("".join(s + "\n" for s in strings), encoding="utf-8")
    argv = ("translate", "--checkpoint", tiny[0], "--beam", 1, "--input", src)
    code, out, _ = run_cli(capsys, *argv, "--markup", "xml", "--placeholders")
    assert code == 0
    lines = out.split("\n")[:-1]
    assert len(lines) == 12
    for source, line in zip(strings, lines):
        assert well_formed(line, "xml") and not (_kept(source) - _kept(line))
    first = sorted((tiny[0].parent).glob("update_*"))[0]  # an ensemble aligns by its mean
    code, out, _ = run_cli(
        capsys, *argv, "--checkpoint", first, "--markup", "xml", "--placeholders"
    )
    assert code == 0
    for source, line in zip(strings, out.split("\n")[:-1]):
        assert well_formed(line, "xml") and not (_kept(source) - _kept(line))
    code, _, err = run_cli(capsys, *argv, "--markup", "xml", "--split")
    assert code == 2 and "not with --split" in err


def test_a_cdata_section_comes_back_whole_and_the_output_stays_well_formed():
    source = "Use <![CDATA[<b> & x]]> with <i>care</i>"
    marked = take_apart(source, PATTERN)
    assert marked.source == "Use with care"
    out = put_back(marked, "Usa con cuidado", [(0, 0), (1, 1), (2, 2)], markup=True)
    assert "<![CDATA[<b> & x]]>" in out and well_formed(out, "xml"), out


def test_html_script_and_style_are_kept_whole_not_translated():
    pattern = placeholder_pattern(markup=True, built_in=False)
    source = "<p>Hi <script>if (a < b) { go('x') }</script> there</p><STYLE>p { x: 1 }</STYLE>"
    marked = take_apart(source, pattern, html=True)
    assert marked.source == "Hi there"
    out = put_back(marked, "Hola alli", [(0, 0), (1, 1)], markup=True)
    assert "<script>if (a < b) { go('x') }</script>" in out and "<STYLE>p { x: 1 }</STYLE>" in out
    assert well_formed(out, "html"), out
    as_xml = take_apart("<script>one</script>", pattern)  # XML has no raw-text elements
    assert as_xml.source == "one"


@pytest.mark.parametrize(
    "user, text, left",
    [
        ("(?i)JESUS", "and Jesus said", "and said"),  # a global flag: alone, it is valid
        (r"(['\"])\w+\1", "say 'hello' now", "say now"),  # its own group numbers
        (r"(?P<ph>X\d)", "a X1 b", "a b"),  # a group name the old alternation used
    ],
)
def test_any_valid_user_pattern_works_as_it_does_alone(user, text, left):
    pattern = placeholder_pattern(markup=True, built_in=True, user=(user,))
    assert take_apart(text, pattern).source == left


def test_a_pattern_that_matches_nothing_is_refused():
    with pytest.raises(UserError, match=r"'a\*' matches the empty string"):
        placeholder_pattern(markup=False, built_in=False, user=("a*",))


def test_signed_numbers_and_exponents_are_taken_whole():
    assert all(PATTERN.fullmatch(n) for n in ("-5", "+3", "1e-3", "2.5E10", "-1,000.50"))
    assert take_apart("from -5 to 1e-3 now", PATTERN).source == "from to now"
    assert take_apart("pages 5-3", PATTERN).source == "pages -"  # a range's dash is a word


def test_things_glued_in_the_source_stay_glued():
    marked = take_apart("Dear {first}{last}, see <b>this</b><i>that</i>", PATTERN)
    out = put_back(marked, "Querido , ver esto aquello", [(i, i) for i in range(4)], True)
    assert "{first}{last}" in out and "</b><i>" in out, out
    counted = take_apart("{count}items left", PATTERN)
    assert (
        put_back(counted, "quedan articulos", [(0, 1), (1, 0)], False) == "quedan {count}articulos"
    )
    spaced = take_apart("{first} {last} x", PATTERN)
    assert put_back(spaced, "y", [(0, 0)], markup=False) == "{first} {last} y"


def test_unpaired_tags_are_warned_of(tiny):
    _, model, vocab = tiny
    request = SearchRequest(DecodeConfig.preset("translation", beam=1))
    with pytest.warns(UserWarning, match=r"1 line\(s\) not well formed.*first: </b> in 'a </b> c'"):
        MarkupOutputs("xml", PATTERN)(
            model, ["a </b> c", "<b>ok</b>"], vocab, request, progress=False, on_truncate=None
        )
