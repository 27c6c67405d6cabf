"""The vocabulary shortlist: IBM Model 1's table, the file, and a beam search over the shortlist
that is exactly the paper's search over the smaller vocabulary."""

import json
import shutil
from dataclasses import replace

import numpy as np
import pytest
import torch
from _cli import one_line_error, run_cli
from _decode_helpers import hypotheses

from aiayn.checkpoint import latest_checkpoint, load_translator
from aiayn.data.binarize import read_meta
from aiayn.data.lexical import NULL, build_shortlist, ibm1, shortlist_text, target_counts
from aiayn.decode import (
    Batching,
    DecodeConfig,
    SampleConfig,
    SearchRequest,
    beam_search,
    decode_ids,
    load_models,
)
from aiayn.decode.cache import decode_step, new_cache
from aiayn.decode.shortlist import Shortlist, Shortlisted, load_shortlist
from aiayn.errors import UserError

pytestmark = pytest.mark.usefixtures("one_thread")

LINES = [
    "In the beginning God created the heaven and the earth.",
    "And God said, Let there be light: and there was light.",
    "And the evening and the morning were the first day.",
    "",
    "And God called the firmament Heaven.",
]


def _pairs(*pairs):
    return [(np.array(s), np.array(t)) for s, t in pairs]


def test_model_1_finds_which_word_translates_which():
    # a<->10, b<->11, c<->12: each word co-occurs with its translation every time, and with
    # the others only sometimes; EM takes the shared mass away from the others.
    pairs = _pairs(([0, 1], [10, 11]), ([0, 2], [10, 12]), ([1, 2], [11, 12]), ([0], [10]))
    table = ibm1(pairs, vocab_size=13, iterations=10)
    best = table.best(per_source=1)
    assert {s: targets[0][0] for s, targets in best.items()} == {0: 10, 1: 11, 2: 12}
    assert best[0][0][1] > 0.6
    for s in (0, 1, 2, NULL):  # a distribution over targets for every source and NULL
        assert table.prob[table.source == s].sum() == pytest.approx(1.0)


def test_best_cuts_each_source_by_size_and_threshold():
    table = ibm1(_pairs(([0, 1], [10, 11, 12]), ([0], [10])), vocab_size=13, iterations=3)
    two = table.best(per_source=2)
    assert all(len(targets) <= 2 for targets in two.values())
    assert all(a[1] >= b[1] for targets in two.values() for a, b in zip(targets, targets[1:]))
    high = table.best(per_source=5, threshold=0.3)
    assert all(p >= 0.3 for targets in high.values() for _, p in targets)
    assert NULL not in two


def test_target_counts_count_the_target_side():
    counts = target_counts(_pairs(([0], [3, 3, 4]), ([1], [4])), vocab_size=6)
    assert counts.tolist() == [0, 0, 0, 2, 2, 0]


def test_a_sentence_may_output_the_frequent_the_specials_and_its_translations():
    shortlist = Shortlist(frequent=(7, 8), lexical={20: (30, 31), 21: (32, 7)}, always=(0, 1, 2, 3))
    assert shortlist.ids([20, 3]) == [0, 1, 2, 3, 7, 8, 30, 31]
    table, real = shortlist.table([[20, 3, 0], [21, 3, 0]])  # padded rows with eos, as src is
    assert table.tolist() == [[0, 1, 2, 3, 7, 8, 30, 31], [0, 1, 2, 3, 7, 8, 32, 0]]
    assert real.tolist() == [[True] * 8, [True] * 7 + [False]]


@pytest.fixture(scope="module")
def model_vocab(tiny_run):
    return load_translator(latest_checkpoint(tiny_run / "checkpoints"))


@pytest.fixture(scope="module")
def shortlist_file(tiny_corpus, tmp_path_factory):
    path = tmp_path_factory.mktemp("shortlist") / "shortlist.json"
    path.write_text(shortlist_text(build_shortlist(tiny_corpus, frequent=300, best=50)))
    return path


class _Masked:
    """The full model with every logit outside ``ids`` set to -inf: log_softmax over it is the
    log_softmax over the shortlist, so its search is the shortlist's, in the model's ids."""

    def __init__(self, model, ids):
        self.model, self.outside = model, torch.ones(model.cfg.vocab_size, dtype=torch.bool)
        self.outside[ids] = False

    def encode(self, src):
        return self.model.encode(src)

    def src_mask(self, src):
        return self.model.src_mask(src)

    def new_cache(self, memory, src_mask, max_len=None):
        return new_cache(self.model, memory, src_mask, max_len=max_len)

    def decode_step(self, tgt_in, cache):
        return decode_step(self.model, tgt_in, cache).masked_fill(self.outside, float("-inf"))


@pytest.mark.parametrize("frequent,best", [(300, 50), (5, 2), (0, 1)])
def test_each_sentence_is_searched_over_its_own_shortlist(
    model_vocab, shortlist_file, frequent, best
):
    model, vocab = model_vocab
    sources = [vocab.encode_source(line) if line else [] for line in LINES]
    shortlist = load_shortlist(shortlist_file, vocab, frequent=frequent, best=best)
    config = DecodeConfig(beam=3, nbest=2, max_len_a=1.0, max_len_b=4)
    request = SearchRequest(config, batching=Batching(batch_size=2))
    found = decode_ids(model, sources, replace(request, shortlist=shortlist))
    assert found[3] == []
    for source, hyps in zip(sources, found):
        if not source:
            continue
        # alone and over the full vocabulary masked to its list: batch-mates change nothing
        alone = beam_search(_Masked(model, shortlist.ids(source)), torch.tensor([source]), config)
        assert hypotheses([hyps]) == hypotheses(alone)
        assert all(set(h.tokens) <= set(shortlist.ids(source)) for h in hyps)
    if frequent == 0:  # a short list must change something, or this test shows nothing
        full = decode_ids(model, sources, request)
        assert hypotheses(found) != hypotheses(full)


def test_each_sentences_output_layer_is_its_rows_of_the_embedding(model_vocab):
    model, _ = model_vocab
    table = torch.tensor([[0, 1, 2, 3, 9, 40], [0, 1, 2, 3, 7, 0]])
    real = torch.tensor([[True] * 6, [True] * 5 + [False]])
    restricted = Shortlisted(model, table, real)
    src = torch.tensor([[5, 6, 3], [8, 3, 0]])
    memory, mask = model.encode(src), model.src_mask(src)
    full = decode_step(model, torch.full((4, 1), 2), new_cache(model, memory, mask))  # 2 beams each
    cache = restricted.new_cache(memory, mask)
    part = restricted.decode_step(torch.full((4, 1), 2), cache)  # bos is entry 2
    torch.testing.assert_close(part[:2], full[:2, table[0]], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(part[2:, :5], full[2:, table[1, :5]], rtol=1e-5, atol=1e-5)
    assert torch.isinf(part[2:, 5]).all()  # padding is never chosen
    # sentence 0 finishes: the second's list stays with it, and entry 4 is its token 7
    cache.select(torch.tensor([2, 3]), sentences=torch.tensor([1]))
    step = restricted.decode_step(torch.tensor([[4], [4]]), cache)
    assert step.shape == (2, 6) and torch.isinf(step[:, 5]).all()


def test_a_shortlist_refuses_what_it_cannot_restrict(model_vocab, shortlist_file, tiny_run):
    model, vocab = model_vocab
    shortlist = load_shortlist(shortlist_file, vocab)
    sources = [vocab.encode_source("light")]
    with pytest.raises(UserError, match="sampling draws from every piece"):
        decode_ids(model, sources, SearchRequest(shortlist=shortlist, sampling=SampleConfig(2)))
    with pytest.raises(UserError, match="constraints cannot be combined"):
        decode_ids(model, sources, SearchRequest(shortlist=shortlist, constraints=[object()]))
    checkpoints = sorted((tiny_run / "checkpoints").glob("update_*"))[:2]
    ensemble, _ = load_models(checkpoints)
    with pytest.raises(UserError, match=r"one model's output layer \(given: Ensemble\)"):
        decode_ids(ensemble, sources, SearchRequest(shortlist=shortlist))


def test_the_file_names_its_vocabulary_and_lists_a_piece_a_line(
    shortlist_file, model_vocab, tiny_corpus
):
    _, vocab = model_vocab
    data = json.loads(shortlist_file.read_text())
    assert data["vocab_fingerprint"] == vocab.fingerprint
    assert data["built_from"]["pairs"] == read_meta(tiny_corpus)["splits"]["train"]["pairs"]
    assert data["built_from"]["model"] == "IBM Model 1"
    assert "<pad>" not in data["frequent"] and "</s>" not in data["frequent"]
    lines = shortlist_file.read_text().splitlines()
    piece, targets = next(iter(data["lexical"].items()))
    assert f"  {json.dumps(piece, ensure_ascii=False)}: " in "\n".join(lines)
    assert len(lines) > len(data["frequent"]) + len(data["lexical"])  # one a line


def test_a_file_for_another_vocabulary_or_no_shortlist_is_refused(
    shortlist_file, model_vocab, tmp_path
):
    _, vocab = model_vocab
    data = json.loads(shortlist_file.read_text())
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**data, "vocab_fingerprint": "0" * 64}))
    with pytest.raises(UserError, match=r"other.json: built for another vocabulary"):
        load_shortlist(other, vocab)
    other.write_text(json.dumps({**data, "frequent": ["not-a-piece-of-it"]}))
    with pytest.raises(UserError, match=r"json: piece 'not-a-piece-of-it' is not in the vocab"):
        load_shortlist(other, vocab)
    other.write_text(json.dumps({**data, "lexical": {"a": 3}}))
    with pytest.raises(UserError, match=r"other.json: not a shortlist's frequent/lexical lists"):
        load_shortlist(other, vocab)
    other.write_text(json.dumps({k: v for k, v in data.items() if k != "frequent"}))
    with pytest.raises(UserError, match=r"other.json: not a shortlist's frequent/lexical lists"):
        load_shortlist(other, vocab)
    other.write_text("{}")
    with pytest.raises(UserError, match=r"other.json: not a shortlist"):
        load_shortlist(other, vocab)
    other.write_text("not json")
    with pytest.raises(UserError, match=r"other.json: not a shortlist"):
        load_shortlist(other, vocab)


def test_shortlist_command_then_translate_with_it(tiny_corpus, tiny_run, tmp_path, capsys):
    out = tmp_path / "sl.json"
    code, stdout, err = run_cli(capsys, "shortlist", "--data", tiny_corpus, "--out", out)
    assert code == 0, err
    pairs = read_meta(tiny_corpus)["splits"]["train"]["pairs"]
    assert f"from {pairs} pairs" in stdout and str(out.resolve()) in err
    src = tmp_path / "in.txt"
    src.write_text("\n".join(LINES) + "\n")
    ckpt = latest_checkpoint(tiny_run / "checkpoints")
    argv = ("translate", "--checkpoint", ckpt, "--input", src, "--shortlist", out)
    code, lines, err = run_cli(capsys, *argv, "--shortlist-frequent", 0, "--shortlist-best", 1)
    assert code == 0, err
    assert len(lines.splitlines()) == len(LINES) and lines.splitlines()[3] == ""
    # the same list again: a shortlist it wrote is replaced, anything else is not
    assert run_cli(capsys, "shortlist", "--data", tiny_corpus, "--out", out)[0] == 0
    src_copy = src.read_text()
    code, _, err = run_cli(capsys, "shortlist", "--data", tiny_corpus, "--out", src)
    assert code == 2 and src.read_text() == src_copy
    one_line_error(err, "exists and is not a shortlist; not replacing it (choose another --out)")


def test_shortlist_options_are_refused_where_they_cannot_apply(tiny_run, tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text("one\n")
    ckpt = latest_checkpoint(tiny_run / "checkpoints")
    argv = ("translate", "--checkpoint", ckpt, "--input", src)
    code, _, err = run_cli(capsys, *argv, "--shortlist-best", 3)
    assert code == 2
    one_line_error(err, "--shortlist-best sizes a shortlist: give --shortlist FILE too")
    code, _, err = run_cli(capsys, *argv, "--shortlist", src, "--engine", "ctranslate2")
    assert code == 2
    one_line_error(err, "the ctranslate2 engine cannot do: --shortlist (")
    for option in ("--prefix", "--constraints"):  # the message used to say "constraints"
        code, out, err = run_cli(capsys, *argv, "--shortlist", src, option, src)
        assert code == 2 and out == ""
        one_line_error(err, f"--shortlist and {option} cannot be combined")
    code, out, err = run_cli(capsys, *argv, "--shortlist", src, "--sample")
    assert code == 2 and out == ""
    one_line_error(err, "--sample draws from every piece")


def test_shortlist_names_the_option_to_write_elsewhere(tiny_corpus, tmp_path, capsys):
    data = shutil.copytree(tiny_corpus, tmp_path / "data")
    (data / "shortlist.json").write_text("my notes\n")
    code, _, err = run_cli(capsys, "shortlist", "--data", data)
    assert code == 2 and (data / "shortlist.json").read_text() == "my notes\n"
    one_line_error(err, "not replacing it (give --out FILE to write elsewhere)")


def test_a_shortlist_of_no_piece_is_refused(
    tiny_run, shortlist_file, model_vocab, tmp_path, capsys
):
    # frequent 0 and best 0 leave pad/unk/bos/eos: every line would translate to "" (exit 0)
    _, vocab = model_vocab
    with pytest.raises(UserError, match="frequent=0 and best=0 leave only the special pieces"):
        load_shortlist(shortlist_file, vocab, frequent=0, best=0)
    assert load_shortlist(shortlist_file, vocab, frequent=0, best=1).lexical  # one is enough
    src = tmp_path / "in.txt"
    src.write_text("In the beginning\n")
    ckpt = latest_checkpoint(tiny_run / "checkpoints")
    argv = ("translate", "--checkpoint", ckpt, "--input", src, "--shortlist", shortlist_file)
    code, out, err = run_cli(capsys, *argv, "--shortlist-frequent", 0, "--shortlist-best", 0)
    assert code == 2 and out == ""
    one_line_error(err, "--shortlist-frequent 0 and --shortlist-best 0 leave only the special")
    code, out, err = run_cli(capsys, *argv, "--shortlist-best", -1)
    assert code == 2 and out == ""
    one_line_error(err, "--shortlist-best must be at least 0, got -1")


def test_two_workers_with_a_shortlist_give_one_process_outputs(model_vocab, shortlist_file):
    model, vocab = model_vocab
    sources = [vocab.encode_source(line) if line else [] for line in LINES]
    shortlist = load_shortlist(shortlist_file, vocab, frequent=5, best=2)
    config = DecodeConfig(beam=3, max_len_a=1.0, max_len_b=4)
    one = decode_ids(
        model, sources, SearchRequest(config, shortlist=shortlist, batching=Batching(1))
    )
    two = decode_ids(
        model, sources, SearchRequest(config, shortlist=shortlist, batching=Batching(1, workers=2))
    )
    assert hypotheses(two) == hypotheses(one)


def test_evaluate_says_which_shortlist_it_used(tiny_run, shortlist_file, tmp_path, capsys):
    src, ref = tmp_path / "src.en", tmp_path / "ref.es"
    src.write_text("In the beginning\nAnd God said\n")
    ref.write_text("En el principio\nY dijo Dios\n")
    ckpt = latest_checkpoint(tiny_run / "checkpoints")
    argv = ("evaluate", "--checkpoint", ckpt, "--src", src, "--ref", ref, "--lang", "es", "--quiet")
    code, out, err = run_cli(capsys, *argv, "--shortlist", shortlist_file, "--shortlist-best", 3)
    assert code == 0, err
    said = json.loads(out)["shortlist"]
    assert said == {"file": str(shortlist_file), "frequent": 100, "best": 3}
    code, out, err = run_cli(capsys, *argv)
    assert code == 0 and json.loads(out)["shortlist"] is None, err


@pytest.mark.parametrize(
    "options, needle",
    [
        (("--iterations", "0"), "--iterations must be at least 1, got 0"),
        (("--max-pairs", "0"), "--max-pairs must be at least 1, got 0"),
        (("--best", "-1"), "--best must be at least 0, got -1"),
        (("--threshold", "2"), "--threshold is a probability, between 0 and 1: got 2.0"),
        (("--out", "."), "is a directory"),
    ],
)
def test_shortlist_options_a_user_gets_wrong_are_one_line(tiny_corpus, capsys, options, needle):
    code, out, err = run_cli(capsys, "shortlist", "--data", tiny_corpus, *options)
    assert code == 2 and out == ""
    one_line_error(err, needle)
    assert not (tiny_corpus / "shortlist.json").exists()


def test_an_int8_model_decodes_within_its_shortlist(tiny_run, shortlist_file):
    """int8's quantized output layer gives its bias by a method: the shortlist reads it so."""
    from aiayn import Translator

    with Translator(latest_checkpoint(tiny_run / "checkpoints"), quantize="int8", workers=1) as t:
        request = t.request(shortlist=shortlist_file, shortlist_frequent=50, shortlist_best=5)
        allowed = [request.shortlist.ids(t.vocab.encode_source(line)) for line in LINES]
        found = t.translate(LINES, request)
        for translation, ids in zip(found, allowed):
            assert {t.vocab.piece_to_id(p) for p in translation.tokens} <= set(ids)
