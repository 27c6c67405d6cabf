"""Your own corpus through ``aiayn prepare``: formats, languages, cleaning counts, held-out
splits, the overlap check, weights and back-translation tags, reproducible bytes."""

from __future__ import annotations

import gzip
import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from _cli import run_cli

from aiayn.data import TokenDataset, Vocab
from aiayn.data.batching import TokenBudgetSampler, corpus_ranges, weighted_epoch
from aiayn.data.clean import normalise
from aiayn.data.corpora import Corpus, Languages, file_language, iter_corpus

WORDS = "the a house dog cat runs sees big small red green old new and with in on of".split()
PALABRAS = "el la casa perro gato corre ve grande rojo verde viejo nuevo y con en sobre de".split()


def distinct_pairs(n: int, seed: int, taken: set[str] = frozenset()) -> list[tuple[str, str]]:
    """``n`` pairs of random words whose sources differ from each other and from ``taken``,
    also once normalised (so no overlap or duplicate happens by chance)."""
    rng, pairs, seen = random.Random(seed), [], {normalise(s) for s in taken}
    while len(pairs) < n:
        k = rng.randint(3, 7)
        src = " ".join(rng.choice(WORDS) for _ in range(k))
        if normalise(src) in seen:
            continue
        seen.add(normalise(src))
        pairs.append((src, " ".join(rng.choice(PALABRAS) for _ in range(k))))
    return pairs


def write_pairs(root: Path, name: str, pairs: list[tuple[str, str]]) -> tuple[Path, Path]:
    src, tgt = root / f"{name}.en", root / f"{name}.es"
    src.write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
    tgt.write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
    return src, tgt


def prepare(capsys, *args) -> tuple[dict, str]:
    code, _, err = run_cli(capsys, "prepare", "--vocab-size", "60", *args)
    assert code == 0, err
    out = Path(args[args.index("--out") + 1])
    return json.loads((out / "meta.json").read_text()), err


def decoded(data: Path, split: str, side: str) -> list[str]:
    dataset, vocab = TokenDataset(data, split), Vocab.load(data / "spm.model")
    return [vocab.decode(getattr(dataset, side)(i).tolist()) for i in range(len(dataset))]


# --- the goal: a messy corpus gives exactly the expected counts ----------------------------------


def messy_corpus(root: Path) -> dict[str, Path]:
    """Two training corpora with every kind of mess, and clean valid and test files.

    web (.en/.es, CRLF endings, a BOM): 40 good pairs, 3 repeated, 2 copies, 1 empty target,
    1 line of Latin-1, 1 pair of 1 word against 10, 1 test pair verbatim and 1 test source
    in other case and punctuation: 50 lines. crawl (TSV, weight 0.5): 20 good pairs, 1 pair
    of web again, 1 copy: 22 lines.
    """
    test = distinct_pairs(5, seed=1)
    valid = distinct_pairs(5, seed=2, taken={s for s, _ in test})
    good = distinct_pairs(60, seed=3, taken={s for s, _ in test + valid})
    web, crawl = good[:40], good[40:]
    shouting = test[3][0].upper().replace(" ", ", ", 1) + "!"
    rows = [
        *web,
        *web[:3],
        ("el gato", "el gato"),
        ("la casa", "la casa"),
        ("a dog", ""),
        ("caf\udce9 dog", "café perro"),
        ("house", " ".join(PALABRAS[:10])),
        test[0],
        (shouting, "otra cosa"),
    ]
    src_lines = [s.encode("utf-8", "surrogateescape") for s, _ in rows]
    tgt_lines = [t.encode("utf-8") for _, t in rows]
    (root / "web.en").write_bytes(b"\xef\xbb\xbf" + b"".join(line + b"\r\n" for line in src_lines))
    (root / "web.es").write_bytes(b"".join(line + b"\r\n" for line in tgt_lines))
    tsv = [f"{s}\t{t}" for s, t in [*crawl, web[5], ("verde", "verde")]]
    with gzip.open(root / "crawl.tsv.gz", "wt", encoding="utf-8") as f:
        f.write("\n".join(tsv) + "\n")
    write_pairs(root, "test", test)
    write_pairs(root, "valid", valid)
    return {"first_source": web[0][0]}


def test_a_messy_corpus_gives_exactly_the_expected_counts(tmp_path, capsys):
    facts = messy_corpus(tmp_path)
    meta, err = prepare(
        capsys,
        *("--corpus", f"name=web,src={tmp_path / 'web.en'},tgt={tmp_path / 'web.es'}"),
        *("--corpus", f"name=crawl,tsv={tmp_path / 'crawl.tsv.gz'},weight=0.5"),
        *("--valid-src", tmp_path / "valid.en", "--valid-tgt", tmp_path / "valid.es"),
        *("--test-src", tmp_path / "test.en", "--test-tgt", tmp_path / "test.es"),
        *("--out", tmp_path / "data"),
    )
    train = meta["splits"]["train"]
    assert (train["read"], train["pairs"]) == (72, 60)
    assert {k: n for k, n in train["cleaning"].items() if n} == {
        "invalid_utf8": 1,
        "empty": 1,
        "ratio": 1,
        "copy": 3,
        "overlap": 2,
        "duplicate": 4,
    }
    assert train["overlap"] == {
        "pair": 1,
        "source": 0,
        "normalised_pair": 0,
        "normalised_source": 1,
        "held_out": {
            "valid": {"pairs": 5, "found_in_train": 0},
            "test": {"pairs": 5, "found_in_train": 2},
        },
    }
    web, crawl = train["corpora"]
    assert (web["name"], web["pairs"], web["weight"], web["cleaning"]["read"]) == (
        "web",
        40,
        1.0,
        50,
    )
    assert (crawl["name"], crawl["pairs"], crawl["weight"], crawl["cleaning"]["duplicate"]) == (
        "crawl",
        20,
        0.5,
        1,
    )
    assert meta["record"] == {"src_lang": "en", "tgt_lang": "es"}  # the files' suffixes
    assert (meta["splits"]["valid"]["pairs"], meta["splits"]["test"]["pairs"]) == (5, 5)
    # the BOM and the CRs are gone from the text the model sees
    sources = decoded(tmp_path / "data", "train", "src")
    assert sources[0] == facts["first_source"] and not any("\r" in s for s in sources)
    assert "train: 60 of 72 pairs kept; dropped 1 invalid_utf8, 1 empty, 1 ratio, 3 copy" in err
    assert (
        "overlap with train (pair or source, exact or normalised): 0 of 5 valid pairs, 2 of 5 test pairs"
        in err
    )


def test_keep_overlap_counts_the_overlap_and_keeps_the_pairs(tmp_path, capsys):
    messy_corpus(tmp_path)
    meta, _ = prepare(
        capsys,
        *("--train-src", tmp_path / "web.en", "--train-tgt", tmp_path / "web.es"),
        *("--test-src", tmp_path / "test.en", "--test-tgt", tmp_path / "test.es"),
        *("--out", tmp_path / "data", "--keep-overlap"),
    )
    train = meta["splits"]["train"]
    assert train["cleaning"]["overlap"] == 0 and train["pairs"] == 42
    assert train["overlap"]["held_out"]["test"] == {"pairs": 5, "found_in_train": 2}


def test_no_clean_drops_only_what_cannot_be_trained_on(tmp_path, capsys):
    messy_corpus(tmp_path)
    meta, _ = prepare(
        capsys,
        *("--train-src", tmp_path / "web.en", "--train-tgt", tmp_path / "web.es"),
        *("--out", tmp_path / "data", "--no-clean"),
    )
    train = meta["splits"]["train"]
    assert {k: n for k, n in train["cleaning"].items() if n} == {"invalid_utf8": 1, "empty": 1}
    assert train["pairs"] == 48


# --- held-out splits carved from train ------------------------------------------------------------


def test_carved_valid_and_test_are_seeded_disjoint_and_left_out_of_train(tmp_path, capsys):
    pairs = distinct_pairs(80, seed=5)
    src, tgt = write_pairs(tmp_path, "all", pairs)
    carve = ("--valid-size", "6", "--test-size", "4", "--train-src", src, "--train-tgt", tgt)
    meta, _ = prepare(capsys, *carve, "--out", tmp_path / "a")
    again, _ = prepare(capsys, *carve, "--out", tmp_path / "b")
    other, _ = prepare(capsys, *carve, "--seed", "2", "--out", tmp_path / "c")
    splits = {s: decoded(tmp_path / "a", s, "src") for s in ("train", "valid", "test")}
    assert [len(splits[s]) for s in ("train", "valid", "test")] == [70, 6, 4]
    assert sorted(sum(splits.values(), [])) == sorted(s for s, _ in pairs)  # each pair once
    assert decoded(tmp_path / "b", "valid", "src") == splits["valid"]  # the same seed
    assert decoded(tmp_path / "c", "valid", "src") != splits["valid"]  # another seed
    assert meta["splits"]["train"]["corpora"][0]["carved_for_held_out"] == 10


def test_carving_all_of_train_is_refused(tmp_path, capsys):
    src, tgt = write_pairs(tmp_path, "all", distinct_pairs(5, seed=5))
    code, _, err = run_cli(
        capsys, "prepare", "--train-src", src, "--train-tgt", tgt, "--valid-size", "5",
        "--out", tmp_path / "o",
    )  # fmt: skip
    assert code == 2 and "leave nothing to train on" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    "options, message",
    [
        (("--valid-size", "-5"), "--valid-size must be a number of pairs, 0 or more, got -5"),
        (("--test-size", "-1"), "--test-size must be a number of pairs, 0 or more, got -1"),
        (("--valid-size", "2", "--seed", "-1"), "--seed must be an integer, 0 or more, got -1"),
        (("--ratio", "nan"), "--ratio must be a number >= 1 (0: off), got nan"),
        (("--ratio", "-1"), "--ratio must be a number >= 1 (0: off), got -1"),
        (("--max-words", "0"), "--max-words must be a number of words >= 1, got 0"),
        (("--max-words", "-2"), "--max-words must be a number of words >= 1, got -2"),
        (("--corpus", "src={src},tgt={tgt},weight=1e9"), "weight must be a number > 0 and at most 100"),
        (("--corpus", "name=a,src={src},tgt={tgt}", "--corpus", "name=a,src={src},tgt={tgt}"), "two train corpora are named 'a'"),
    ],
)  # fmt: skip
def test_prepare_options_out_of_range_are_one_line(tmp_path, capsys, options, message):
    """Each refused before any work, where they were numpy tracebacks, every pair dropped
    and blamed on the data, or (a weight of 1e9) an epoch that took all memory."""
    src, tgt = write_pairs(tmp_path, "all", distinct_pairs(20, seed=5))
    options = [o.format(src=src, tgt=tgt) for o in options]
    if "--corpus" not in options:
        options += ["--train-src", str(src), "--train-tgt", str(tgt)]
    code, _, err = run_cli(capsys, "prepare", *options, "--out", tmp_path / "o")
    assert code == 2 and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "o").exists()


# --- formats, languages, spec files --------------------------------------------------------------


TMX = """<?xml version="1.0" encoding="UTF-8"?>
<tmx version="1.4"><header srclang="en" segtype="sentence" datatype="plaintext"/>
<body>
{units}
</body></tmx>
"""


def test_tmx_units_stream_by_language_tag(tmp_path):
    pairs = distinct_pairs(3, seed=9)
    units = "\n".join(
        f'<tu><tuv xml:lang="es-ES"><seg>{t}</seg></tuv><tuv xml:lang="en-GB"><seg>{s}</seg></tuv></tu>'
        for s, t in pairs
    )
    path = tmp_path / "memory.tmx"
    broken = '<tu><tuv xml:lang="en"><seg>two\n  lines</seg></tuv><tuv xml:lang="es"><seg>dos</seg></tuv></tu>'
    alone = '<tu><tuv xml:lang="fr"><seg>x</seg></tuv></tu>'
    path.write_text(TMX.format(units="\n".join([units, broken, alone])))
    corpus = Corpus("tm", "tmx", (path,))
    with pytest.warns(UserWarning, match=r"other languages: fr \(1\)"):  # the unit alone
        got = list(iter_corpus(corpus, Languages("en", "es")))
    assert got == [*pairs, ("two lines", "dos"), ("", "")]


def test_tmx_codes_in_any_case_and_units_of_other_languages_are_said(tmp_path):
    units = [
        '<tu><tuv xml:lang="EN-US"><seg>one</seg></tuv><tuv xml:lang="ES"><seg>uno</seg></tuv></tu>',
        '<tu><tuv xml:lang="en"><seg>two</seg></tuv><tuv xml:lang="fr"><seg>deux</seg></tuv></tu>',
    ]
    path = tmp_path / "memory.tmx"
    path.write_text(TMX.format(units="\n".join(units)))
    corpus = Corpus("tm", "tmx", (path,))
    with pytest.warns(UserWarning, match=r"units without en or es hold other languages: fr \(1\)"):
        got = list(iter_corpus(corpus, Languages("en", "es-MX")))
    assert got == [("one", "uno"), ("two", "")]


@pytest.mark.parametrize("lang", ["english", "x/y", "EN", ""])
def test_a_language_that_is_no_code_is_refused(tmp_path, capsys, lang):
    src, tgt = write_pairs(tmp_path, "all", distinct_pairs(5, seed=5))
    code, _, err = run_cli(
        capsys, "prepare", "--train-src", src, "--train-tgt", tgt, "--src-lang", lang,
        "--out", tmp_path / "o",
    )  # fmt: skip
    assert code == 2 and f"--src-lang {lang!r}: not a language code" in err, err


def test_a_broken_tmx_names_the_line(tmp_path, capsys):
    path = tmp_path / "memory.tmx"
    path.write_text(TMX.format(units="<tu><tuv xml:lang='en'><seg>a</seg></tu>"))
    code, _, err = run_cli(
        capsys, "prepare", "--train-tmx", path, "--src-lang", "en", "--tgt-lang", "es",
        "--out", tmp_path / "o",
    )  # fmt: skip
    assert code == 2 and f"{path}: line 4, column" in err and "not valid TMX" in err


def test_a_tmx_without_languages_asks_for_them(tmp_path, capsys):
    path = tmp_path / "memory.tmx"
    path.write_text(TMX.format(units=""))
    code, _, err = run_cli(capsys, "prepare", "--train-tmx", path, "--out", tmp_path / "o")
    assert code == 2 and "give --src-lang and --tgt-lang" in err


@pytest.mark.parametrize(
    "name, lang",
    [("train.de", "de"), ("news.pt-BR.gz", "pt-BR"), ("train.src", None), ("corpus", None)],
)
def test_file_language_reads_the_last_suffix(name, lang):
    assert file_language(Path(name)) == lang


def test_suffixes_that_disagree_with_the_given_language_are_refused(tmp_path, capsys):
    src, tgt = write_pairs(tmp_path, "train", distinct_pairs(30, seed=1))
    code, _, err = run_cli(
        capsys, "prepare", "--train-src", src, "--train-tgt", tgt, "--tgt-lang", "de",
        "--out", tmp_path / "o",
    )  # fmt: skip
    assert code == 2 and "suffix says tgt language 'es', but --tgt-lang de says 'de'" in err


def test_a_data_spec_file_names_corpora_weights_and_languages(tmp_path, capsys):
    pairs = distinct_pairs(70, seed=4)
    (tmp_path / "raw").mkdir()
    write_pairs(tmp_path / "raw", "news", pairs[:40])
    write_pairs(tmp_path / "raw", "dev", pairs[40:50])
    (tmp_path / "raw" / "bt.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in pairs[50:]))
    spec = tmp_path / "data.yaml"
    spec.write_text(
        "src_lang: en\ntgt_lang: es\n"
        "train:\n"
        "  - {name: news, src: raw/news.en, tgt: raw/news.es, weight: 2}\n"
        "  - {name: bt, tsv: raw/bt.tsv, back_translated: true}\n"
        "valid: {src: raw/dev.en, tgt: raw/dev.es}\n"
    )
    meta, _ = prepare(capsys, "--data-spec", spec, "--out", tmp_path / "data")
    corpora = meta["splits"]["train"]["corpora"]
    assert [(c["name"], c["pairs"], c["weight"], c["back_translated"]) for c in corpora] == [
        ("news", 40, 2.0, False),
        ("bt", 20, 1.0, True),
    ]
    # tagged back-translation: every bt source opens with the tag (after sentencepiece's
    # word-boundary piece), one piece of the vocabulary
    vocab, train = Vocab.load(tmp_path / "data/spm.model"), TokenDataset(tmp_path / "data", "train")
    tag = vocab.piece_to_id("<BT>")
    assert tag != vocab.unk_id
    opens = [tag in train.src(i)[:2].tolist() for i in range(len(train))]
    assert opens == [False] * 40 + [True] * 20
    assert corpus_ranges(meta["splits"]["train"]) == [(0, 40, 2.0), (40, 60, 1.0)]


def test_an_unknown_key_in_a_data_spec_is_named(tmp_path, capsys):
    spec = tmp_path / "data.yaml"
    spec.write_text("train:\n  - {src: a.en, tgt: a.es, wieght: 2}\n")
    code, _, err = run_cli(capsys, "prepare", "--data-spec", spec, "--out", tmp_path / "o")
    assert code == 2 and f"{spec}: train[0]: unknown key 'wieght'" in err


# --- weights at batching time ---------------------------------------------------------------------


def test_weighted_epoch_takes_each_corpus_by_its_weight():
    usable = np.arange(100)
    corpora = [(0, 40, 2.0), (40, 80, 0.5), (80, 100, 1.5)]
    epoch = weighted_epoch(usable, corpora, np.random.default_rng(0))
    counts = np.bincount(epoch, minlength=100)
    assert (counts[:40] == 2).all()
    assert (counts[40:80] <= 1).all() and counts[40:80].sum() == 20
    assert (counts[80:] >= 1).all() and counts[80:].sum() == 30


def test_weights_of_one_leave_the_batches_exactly_as_unweighted():
    lens = np.random.default_rng(0).integers(1, 30, 200)
    plain = TokenBudgetSampler(lens, lens, 200, 200, seed=3)
    ones = TokenBudgetSampler(
        lens, lens, 200, 200, seed=3, corpora=[(0, 120, 1.0), (120, 200, 1.0)]
    )
    halved = TokenBudgetSampler(
        lens, lens, 200, 200, seed=3, corpora=[(0, 120, 1.0), (120, 200, 0.5)]
    )
    assert ones.all_batches(0) == plain.all_batches(0)
    taken = sorted(i for batch in halved.all_batches(0) for i in batch)
    assert len(taken) == 160 and taken[:120] == list(range(120))


# --- reproducible bytes, interruption -------------------------------------------------------------


def test_the_same_input_gives_the_same_spm_model_bytes(tmp_path, capsys):
    src, tgt = write_pairs(tmp_path, "train", distinct_pairs(60, seed=8))
    for out in ("a", "b"):
        prepare(capsys, "--train-src", src, "--train-tgt", tgt, "--out", tmp_path / out)
    for name in ("spm.model", "spm.vocab", "train.src.tokens.npy", "meta.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.slow
def test_a_stopped_prepare_says_so_in_one_line_and_leaves_the_old_dataset(tmp_path, capsys, signum):
    src, tgt = write_pairs(tmp_path, "small", distinct_pairs(40, seed=6))
    out = tmp_path / "data"
    prepare(capsys, "--train-src", src, "--train-tgt", tgt, "--out", out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    rng = random.Random(0)  # enough text that preparing it takes a while
    lines = [" ".join(rng.choice(WORDS + PALABRAS) for _ in range(12)) for _ in range(300_000)]
    big_src, big_tgt = tmp_path / "big.en", tmp_path / "big.es"
    big_src.write_text("\n".join(lines) + "\n")
    big_tgt.write_text("\n".join(reversed(lines)) + "\n")
    argv = ["prepare", "--train-src", big_src, "--train-tgt", big_tgt, "--out", out]
    proc = subprocess.Popen(
        [sys.executable, "-m", "aiayn", *map(str, argv), "--vocab-size", "60"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".data.*.tmp")) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # inside the cleaning pass
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    name = signal.Signals(signum).name
    assert proc.returncode == 128 + signum, err
    assert err.strip().splitlines() == [
        f"aiayn prepare: stopped by {name}; nothing written to {out} (a dataset already there "
        "is unchanged); run the same command again to prepare it"
    ]
    assert not list(tmp_path.glob(".data.*"))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


# --- evaluate scores in the language the training data recorded ------------------------------------


def test_evaluate_takes_the_target_language_the_checkpoint_records(tiny_run, tmp_path, capsys):
    import shutil

    from aiayn.translator import Translator

    ckpt = tmp_path / "ckpt"
    shutil.copytree(sorted((tiny_run / "checkpoints").glob("update_*"))[-1], ckpt)
    meta = json.loads((ckpt / "meta.json").read_text())
    meta.setdefault("dataset", {})["record"] = {"tgt_lang": "fr"}
    (ckpt / "meta.json").write_text(json.dumps(meta))
    with Translator(ckpt, workers=1) as translator:
        assert translator.target_language() == "fr"
    src, ref = tmp_path / "s.en", tmp_path / "r.fr"
    src.write_text("In the beginning.\n")
    ref.write_text("Au commencement.\n")
    code, out, err = run_cli(capsys, "evaluate", "--checkpoint", ckpt, "--src", src, "--ref", ref)
    assert code == 0 and json.loads(out)["paper_bleu_lang"] == "fr"
    del meta["dataset"]["record"]
    (ckpt / "meta.json").write_text(json.dumps(meta))
    code, out, err = run_cli(capsys, "evaluate", "--checkpoint", ckpt, "--src", src, "--ref", ref)
    assert code == 0 and json.loads(out)["paper_bleu_lang"] == "de"
    assert "records no target language: paper BLEU tokenises as German" in err


# --- language identification (opt-in) ---------------------------------------------------------------


def test_langid_keeps_the_bundled_verses_and_drops_swapped_or_foreign_sides():
    pytest.importorskip("py3langid")
    from aiayn.data import bundled_corpus_paths
    from aiayn.data.clean import Cleaner, Cleaning, language_identifier
    from aiayn.files import iter_lines

    fits = language_identifier(("en", "es"))
    cleaner = Cleaner(Cleaning(langid=True), training=False, language_fits=fits, langs=("en", "es"))
    src, tgt = bundled_corpus_paths()["valid"]
    pairs = list(zip(iter_lines(src), iter_lines(tgt)))
    kept = sum(cleaner.keep(s, t) for s, t in pairs)
    assert kept >= 0.995 * len(pairs)  # good verses are kept (docs/data.md: 1401 of 1403)
    lost = cleaner.counts["language"]
    assert not any(cleaner.keep(t, s) for s, t in pairs[:200])  # sides swapped: all caught
    assert not cleaner.keep(pairs[0][0], "Le chat dort sur la table de la cuisine.")
    assert cleaner.counts["language"] == lost + 201


# --- named corpora through the binariser: counts per corpus, the same files with workers ---------


def test_binarised_corpus_counts_are_the_same_with_workers(tmp_path, capsys):
    from aiayn.data.binarize import binarize_split

    src, tgt = write_pairs(tmp_path, "train", distinct_pairs(60, seed=2))
    prepare(capsys, "--train-src", src, "--train-tgt", tgt, "--out", tmp_path / "d")
    vocab = Vocab.load(tmp_path / "d/spm.model")
    # one pair in each group is over max_tokens: the groups' kept counts must say which
    pairs = distinct_pairs(40, seed=3)
    for i in (2, 17, 33):
        pairs[i] = (" ".join([pairs[i][0]] * 8), pairs[i][1])
    results = {}
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        out.mkdir()
        counts = binarize_split(
            pairs, vocab, out, "train", 20, chunk_pairs=7, workers=workers, group_sizes=[10, 10, 20]
        )
        results[workers] = (counts, {p.name: p.read_bytes() for p in out.iterdir()})
    assert results[1] == results[2]
    fits = [max(len(vocab.encode(s)), len(vocab.encode(t))) <= 20 for s, t in pairs]
    expected = [sum(fits[:10]), sum(fits[10:20]), sum(fits[20:])]
    assert results[1][0]["group_pairs"] == expected and sum(expected) == results[1][0]["pairs"]
    assert not fits[2] and not fits[17] and not fits[33] and 0 < sum(fits) < 40


def test_a_tmx_names_its_languages_by_its_header_and_units(tmp_path, capsys):
    pairs = distinct_pairs(60, seed=10)
    units = "\n".join(
        f'<tu><tuv xml:lang="en-US"><seg>{s}</seg></tuv><tuv xml:lang="es"><seg>{t}</seg></tuv></tu>'
        for s, t in pairs
    )
    path = tmp_path / "memory.tmx"
    path.write_text(TMX.format(units=units))  # its header says srclang="en"
    meta, _ = prepare(capsys, "--train-tmx", path, "--out", tmp_path / "data")
    assert meta["record"] == {"src_lang": "en", "tgt_lang": "es"}
    assert meta["splits"]["train"]["pairs"] == 60
    assert decoded(tmp_path / "data", "train", "tgt")[:2] == [t for _, t in pairs[:2]]


def test_normalise_folds_case_punctuation_and_spaces():
    assert normalise("  Hello,   World! «Qué» tal? ") == "hello world qué tal"


def test_a_corpus_that_cleaning_empties_is_one_line_naming_the_filters(tmp_path, capsys):
    src, tgt = tmp_path / "copies.en", tmp_path / "copies.es"
    src.write_text("el gato\nla casa\n")
    tgt.write_text("el gato\nla casa\n")
    code, _, err = run_cli(
        capsys, "prepare", "--train-src", src, "--train-tgt", tgt, "--out", tmp_path / "o"
    )
    assert code == 2 and err.count("\n") == 1
    assert f"train split ({src}, {tgt}): 0 of 2 pairs kept" in err and "2 copy" in err


def test_a_signal_while_the_vocabulary_reads_its_text_comes_through_sentencepiece(tmp_path):
    def sentences():
        yield from [f"{w} runs" for w in WORDS] * 20
        raise KeyboardInterrupt  # what Ctrl-C raises there

    with pytest.raises(KeyboardInterrupt):
        Vocab.train(sentences(), tmp_path / "spm", 40)


def test_langid_drops_the_swapped_pairs_of_a_corpus(tmp_path, capsys):
    pytest.importorskip("py3langid")
    from aiayn.data import bundled_corpus_paths
    from aiayn.files import iter_lines

    src, tgt = bundled_corpus_paths()["valid"]
    pairs = list(zip(iter_lines(src), iter_lines(tgt)))[:100]
    pairs[10:20] = [(t, s) for s, t in pairs[10:20]]  # sides swapped, as crawls have them
    files = write_pairs(tmp_path, "mixed", pairs)
    train = ("--train-src", files[0], "--train-tgt", files[1])
    meta, err = prepare(capsys, *train, "--langid", "--out", tmp_path / "d", "--vocab-size", "300")
    assert meta["splits"]["train"]["cleaning"]["language"] == 10
    assert "10 language" in err
