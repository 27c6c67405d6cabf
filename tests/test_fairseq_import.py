"""``aiayn import`` of a fairseq checkpoint (``model.pt`` + ``dict.SRC.txt`` / ``dict.TGT.txt``):
a random model under fairseq's tensor names, saved here as fairseq 0.12 saves it (the model's
options an ``argparse.Namespace`` in ``cfg["model"]``; an older fairseq's ``args`` with joined
``in_proj`` weights), imported, gives the log-probabilities that a forward pass written from
fairseq's definitions gives (its sinusoids from position 2, ``</s>`` starting the decoder,
post- and pre-norm, joined and separate dictionaries). A planted pickle is refused with nothing
executed; what the model cannot represent is refused in one line naming the option. fairseq
itself is the oracle of ``test_fairseq_oracle.py``."""

import argparse
import io
import json
import math
import os
import shutil
import sys
from collections import Counter
from pathlib import Path

import pytest
import sentencepiece as spm
import torch
import torch.nn.functional as F
from _cli import run_cli
from _export_models import corpus_lines

from aiayn.checkpoint import load_translator
from aiayn.cli.main import main
from aiayn.export.common import ExportError
from aiayn.export.fairseq_import import fairseq_to_transformer, import_fairseq

D, H, FFN, LAYERS = 16, 2, 24, 2
EOS = 2  # fairseq's </s>, which also starts its decoder


def train_spm(lines: list[str], prefix: Path, size: int) -> Path:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_prefix=str(prefix),
        vocab_size=size,
        minloglevel=2,
        num_threads=1,
    )
    return Path(f"{prefix}.model")


def write_dictionary(model: Path, path: Path) -> list[str]:
    """fairseq-preprocess's dict file of a SentencePiece model's pieces (padded to a multiple
    of 8 with madeupwords, as it pads); the dictionary's symbols in id order."""
    sp = spm.SentencePieceProcessor(model_file=str(model))
    words = [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if not sp.is_control(i)]
    words = [w for w in words if w != "<unk>"]
    words += [f"madeupword{i:04d}" for i in range(-(len(words) + 4) % 8)]
    path.write_text("".join(f"{w} {100 - i % 50}\n" for i, w in enumerate(words)), "utf-8")
    return ["<s>", "<pad>", "</s>", "<unk>", *words]


def options(**changes) -> dict:
    """The model's options as fairseq's transformer architectures record them."""
    return {
        "arch": "transformer", "encoder_embed_dim": D, "decoder_embed_dim": D,
        "encoder_ffn_embed_dim": FFN, "decoder_ffn_embed_dim": FFN, "encoder_layers": LAYERS,
        "decoder_layers": LAYERS, "encoder_attention_heads": H, "decoder_attention_heads": H,
        "dropout": 0.3, "attention_dropout": 0.0, "activation_dropout": 0.0,
        "activation_fn": "relu", "encoder_normalize_before": False,
        "decoder_normalize_before": False, "share_all_embeddings": True,
        "share_decoder_input_output_embed": True, "encoder_learned_pos": False,
        "decoder_learned_pos": False, "no_scale_embedding": False, "layernorm_embedding": False,
        "adaptive_softmax_cutoff": None, "max_source_positions": 1024,
        "max_target_positions": 1024, "decoder_output_dim": D, "decoder_input_dim": D,
        "source_lang": "en", "target_lang": "es", **changes,
    }  # fmt: skip


def random_state(sizes: tuple[int, int], shared: bool, pre: bool, seed: int = 0) -> dict:
    """A random model's tensors under fairseq 0.12's names."""
    g = torch.Generator().manual_seed(seed)

    def w(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.3

    state = {"encoder.embed_tokens.weight": w(sizes[0], D)}
    state["decoder.embed_tokens.weight"] = (
        state["encoder.embed_tokens.weight"] if shared else w(sizes[1], D)
    )
    state["decoder.output_projection.weight"] = state["decoder.embed_tokens.weight"]
    for side in ("encoder", "decoder"):
        state[f"{side}.version"] = torch.tensor([3.0])
        state[f"{side}.embed_positions._float_tensor"] = torch.zeros(1)
        if pre:
            state[f"{side}.layer_norm.weight"], state[f"{side}.layer_norm.bias"] = 1 + w(D), w(D)
        for i in range(LAYERS):
            p = f"{side}.layers.{i}"
            attentions = ("self_attn", "encoder_attn") if side == "decoder" else ("self_attn",)
            for a in attentions:
                for x in ("q", "k", "v", "out"):
                    state[f"{p}.{a}.{x}_proj.weight"], state[f"{p}.{a}.{x}_proj.bias"] = (
                        w(D, D),
                        w(D),
                    )
                state[f"{p}.{a}_layer_norm.weight"] = 1 + w(D)
                state[f"{p}.{a}_layer_norm.bias"] = w(D)
            state[f"{p}.fc1.weight"], state[f"{p}.fc1.bias"] = w(FFN, D), w(FFN)
            state[f"{p}.fc2.weight"], state[f"{p}.fc2.bias"] = w(D, FFN), w(D)
            state[f"{p}.final_layer_norm.weight"], state[f"{p}.final_layer_norm.bias"] = 1 + w(D), w(D)  # fmt: skip
    return state


def legacy(state: dict) -> dict:
    """The same tensors as an older fairseq names them: joined in_proj, layer_norms.0/1."""
    out = {}
    for name, value in state.items():
        if ".q_proj." in name:
            parts = [state[name.replace(".q_proj.", f".{x}_proj.")] for x in "qkv"]
            out[name.replace("q_proj.", "in_proj_")] = torch.cat(parts)
        elif ".k_proj." in name or ".v_proj." in name:
            continue
        elif name.startswith("encoder.layers") and "layer_norm." in name:
            n = "0" if "self_attn_layer_norm" in name else "1"
            kind = name.rsplit(".", 1)[1]
            out[name.split(".self_attn_layer_norm")[0].split(".final_layer_norm")[0] + f".layer_norms.{n}.{kind}"] = value  # fmt: skip
        else:
            out[name] = value
    return out


def save_checkpoint(path: Path, state: dict, opts: dict, old: bool = False) -> None:
    """As fairseq 0.12's trainer saves (``cfg`` plain data, the model's options a Namespace),
    or, ``old``, as earlier versions did (``args``, a Namespace)."""
    model = argparse.Namespace(**opts)
    extra = {"train_iterator": {"epoch": 3}, "val_loss": 4.5, "metrics": {}}
    history = [{"criterion_name": "LabelSmoothedCrossEntropyCriterion", "num_updates": 300}]
    if old:
        found = {"args": model, "model": legacy(state), "extra_state": extra}
    else:
        cfg = {"model": model, "task": {"_name": "translation", "source_lang": "en"}}
        found = {"args": None, "cfg": cfg, "model": state, "extra_state": extra}
    torch.save({**found, "optimizer_history": history, "last_optimizer_state": {}}, path)


def write_directory(root: Path, kind: str) -> tuple[dict, list[str], list[str]]:
    """A fairseq model directory: model.pt, dict.en.txt, dict.es.txt and the SentencePiece
    model(s). ``kind``: "joined" (0.12, one dictionary, all embeddings shared), "separate"
    (two dictionaries and models), "pre" (pre-norm), "old" (an older fairseq's checkpoint).
    Its tensors and the (source, target) symbols."""
    root.mkdir(parents=True, exist_ok=True)
    en, es = corpus_lines("train", 0, 800), corpus_lines("train", 1, 800)
    if kind == "separate":
        models = [train_spm(en, root / "spm.en", 150), train_spm(es, root / "spm.es", 170)]
    else:
        models = [train_spm(en + es, root / "sentencepiece.bpe", 200)] * 2
    source = write_dictionary(models[0], root / "dict.en.txt")
    target = write_dictionary(models[1], root / "dict.es.txt")
    shared = kind != "separate"
    state = random_state((len(source), len(target)), shared, kind == "pre")
    opts = options(
        share_all_embeddings=shared,
        encoder_normalize_before=kind == "pre",
        decoder_normalize_before=kind == "pre",
    )
    save_checkpoint(root / "checkpoint_best.pt", state, opts, old=kind == "old")
    return state, source, target


# --- fairseq's forward pass, from its definitions (transformer_layer.py, multihead_attention.py)


def fairseq_positions(length: int) -> torch.Tensor:
    """SinusoidalPositionalEmbedding.get_embedding's rows for make_positions' 2, 3, ..."""
    half = D // 2
    scale = torch.exp(torch.arange(half, dtype=torch.float) * -(math.log(10000) / (half - 1)))
    table = torch.arange(length + 2, dtype=torch.float)[:, None] * scale[None]
    return torch.cat([torch.sin(table), torch.cos(table)], 1)[2:]


def attention(s: dict, name: str, q_in, kv_in, causal: bool):
    def heads(x, p):
        return (
            F.linear(x, s[f"{name}.{p}_proj.weight"], s[f"{name}.{p}_proj.bias"])
            .view(len(x), H, -1)
            .transpose(0, 1)
        )

    q, k, v = heads(q_in, "q") * (D // H) ** -0.5, heads(kv_in, "k"), heads(kv_in, "v")
    scores = q @ k.transpose(1, 2)
    if causal:
        scores = scores.masked_fill(~torch.ones_like(scores[0]).tril().bool(), -math.inf)
    out = (scores.softmax(-1) @ v).transpose(0, 1).reshape(len(q_in), D)
    return F.linear(out, s[f"{name}.out_proj.weight"], s[f"{name}.out_proj.bias"])


def residual(s: dict, norm: str, x, sublayer, pre: bool):
    """fairseq's residual block: x + f(LN(x)) with normalize_before, else LN(x + f(x))."""
    ln = lambda h: F.layer_norm(h, (D,), s[f"{norm}.weight"], s[f"{norm}.bias"], 1e-5)  # noqa: E731
    return x + sublayer(ln(x)) if pre else ln(x + sublayer(x))


def feed_forward(s: dict, p: str, x):
    return F.linear(F.relu(F.linear(x, s[f"{p}.fc1.weight"], s[f"{p}.fc1.bias"])), s[f"{p}.fc2.weight"], s[f"{p}.fc2.bias"])  # fmt: skip


def fairseq_log_probs(s: dict, src: list[int], tgt: list[int], pre: bool) -> torch.Tensor:
    """log P(tgt[t] | tgt[:t], src) for each t, in fairseq's ids (both end with </s>)."""
    x = D**0.5 * s["encoder.embed_tokens.weight"][src] + fairseq_positions(len(src))
    for i in range(LAYERS):
        p = f"encoder.layers.{i}"
        x = residual(s, f"{p}.self_attn_layer_norm", x, lambda h, p=p: attention(s, f"{p}.self_attn", h, h, False), pre)  # fmt: skip
        x = residual(s, f"{p}.final_layer_norm", x, lambda h, p=p: feed_forward(s, p, h), pre)
    if pre:
        x = F.layer_norm(x, (D,), s["encoder.layer_norm.weight"], s["encoder.layer_norm.bias"])
    prev = [EOS, *tgt[:-1]]  # fairseq's decoder starts from </s>
    y = D**0.5 * s["decoder.embed_tokens.weight"][prev] + fairseq_positions(len(tgt))
    for i in range(LAYERS):
        p = f"decoder.layers.{i}"
        y = residual(s, f"{p}.self_attn_layer_norm", y, lambda h, p=p: attention(s, f"{p}.self_attn", h, h, True), pre)  # fmt: skip
        y = residual(s, f"{p}.encoder_attn_layer_norm", y, lambda h, p=p: attention(s, f"{p}.encoder_attn", h, x, False), pre)  # fmt: skip
        y = residual(s, f"{p}.final_layer_norm", y, lambda h, p=p: feed_forward(s, p, h), pre)
    if pre:
        y = F.layer_norm(y, (D,), s["decoder.layer_norm.weight"], s["decoder.layer_norm.bias"])
    logits = y @ s["decoder.output_projection.weight"].T
    return torch.log_softmax(logits.double(), -1)[torch.arange(len(tgt)), tgt]


@pytest.fixture(scope="module", params=["joined", "separate", "pre", "old"])
def fairseq_dir(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param) / "model"
    return root, request.param, *write_directory(root, request.param)


def test_imported_model_gives_fairseqs_log_probs(fairseq_dir, tmp_path):
    """Teacher-forced log-probabilities of the imported checkpoint (``aiayn import``, then
    loaded as any checkpoint) equal fairseq's forward pass, token by token."""
    root, kind, state, source, target = fairseq_dir
    spm_options = ["--source-spm", str(root / "spm.en.model"), "--target-spm", str(root / "spm.es.model")]  # fmt: skip
    given = spm_options if kind == "separate" else []  # else: the directory's one *.model
    assert main(["import", str(root), "--out", str(tmp_path / "ckpt"), *given]) in (None, 0)
    model, vocab = load_translator(tmp_path / "ckpt")
    assert model.cfg.positional == "fairseq" and model.cfg.norm == ("pre" if kind == "pre" else "post")  # fmt: skip
    src_ids, tgt_ids = {p: i for i, p in enumerate(source)}, {p: i for i, p in enumerate(target)}
    for en, es in zip(corpus_lines("test", 0, 6), corpus_lines("test", 1, 6)):
        src, tgt = vocab.encode_source(en), vocab.encode_target(es) + [vocab.eos_id]
        theirs = fairseq_log_probs(
            state,
            [src_ids.get(vocab.id_to_piece(i), 3) for i in src],
            [tgt_ids.get(vocab.id_to_piece(i), 3) for i in tgt],
            pre=kind == "pre",
        )
        with torch.no_grad():
            logits = model(torch.tensor([src]), torch.tensor([[vocab.bos_id, *tgt[:-1]]]))
        ours = torch.log_softmax(logits[0].double(), -1)[torch.arange(len(tgt)), tgt]
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)


@pytest.fixture(scope="module")
def joined(tmp_path_factory) -> tuple[Path, dict]:
    """One "joined" directory (training SentencePiece takes seconds) and its tensors."""
    root = tmp_path_factory.mktemp("joined") / "model"
    return root, write_directory(root, "joined")[0]


def copy_of(joined: tuple[Path, dict], tmp_path: Path) -> Path:
    return Path(shutil.copytree(joined[0], tmp_path / "m"))


def test_fairseq_generates_defaults_are_recorded_for_its_rules(tmp_path, joined):
    """The checkpoint records fairseq-generate's beam 5 and lenpen 1 under --search-rules fairseq."""
    assert main(["import", str(copy_of(joined, tmp_path)), "--out", str(tmp_path / "ckpt")]) in (
        None,
        0,
    )
    meta = json.loads((tmp_path / "ckpt" / "meta.json").read_text(encoding="utf-8"))
    assert meta["search_defaults"] == {"fairseq": {"beam": 5, "alpha": 1.0}}


def test_ids_are_placed_as_fairseq_decodes(tmp_path):
    """Our bos is fairseq's </s> embedding, never output; <s> is an ordinary piece; separate
    dictionaries join, a source-only symbol never output."""
    _, source, target = write_directory(tmp_path / "m", "separate")
    model, layout = fairseq_to_transformer(tmp_path / "m")
    pieces, bias = layout.pieces, model.generator.bias.detach()
    assert pieces[:4] == ["<pad>", "<unk>", "<bos>", "</s>"] and pieces[4] == "<s>"
    assert set(pieces[4:]) == (set(source) | set(target)) - {"<pad>", "<unk>", "</s>"}
    emb = model.tgt_embed.tokens.weight
    torch.testing.assert_close(emb[2], emb[3])  # bos starts the decoder as fairseq's </s>
    source_only = next(i for i, p in enumerate(pieces) if p in source and p not in target)
    assert bias[2] == bias[source_only] == -100.0 and bias[0] == bias[3] == 0.0


class Planted:
    """A pickle that would run a shell command when loaded without weights_only."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_planted_pickle_is_refused_with_nothing_executed(tmp_path, capsys, joined):
    root, marker = copy_of(joined, tmp_path), tmp_path / "code-ran"
    found = torch.load(root / "checkpoint_best.pt", weights_only=False)  # our own fixture
    torch.save({**found, "extra_state": Planted(marker)}, root / "checkpoint_best.pt")
    with pytest.raises(SystemExit) as exit_:
        main(["import", str(root), "--out", str(tmp_path / "ckpt")])
    err = capsys.readouterr().err.strip()
    assert (
        exit_.value.code == 2
        and len(err.splitlines()) == 1
        and "refused" in err
        and "system" in err
    )
    assert str(root / "checkpoint_best.pt") in err and not marker.exists()
    assert not (tmp_path / "ckpt").exists()


REFUSED = {
    "learned positions": ({"encoder_learned_pos": True}, "encoder_learned_pos=True"),
    "untied output": (
        {"share_all_embeddings": False, "share_decoder_input_output_embed": False},
        "share_decoder_input_output_embed=False",
    ),
    "activation": ({"activation_fn": "tanh"}, "activation_fn 'tanh'"),
    "layernorm embedding": ({"layernorm_embedding": True}, "layernorm_embedding=True"),
    "half pre-norm": (
        {"encoder_normalize_before": True},
        "encoder_normalize_before=True and decoder_normalize_before=False",
    ),  # fmt: skip
    "another model": ({"arch": "lstm"}, "arch 'lstm'"),
    "adaptive softmax": ({"adaptive_softmax_cutoff": "1000,2000"}, "adaptive_softmax_cutoff"),
}


@pytest.mark.parametrize("changes, message", REFUSED.values(), ids=REFUSED.keys())
def test_what_cannot_be_represented_is_refused_in_one_line(tmp_path, joined, changes, message):
    root = copy_of(joined, tmp_path)
    save_checkpoint(root / "checkpoint_best.pt", joined[1], options(**changes))
    with pytest.raises(ExportError, match="checkpoint_best.pt") as info:
        fairseq_to_transformer(tmp_path / "m")
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_dictionary_that_is_not_the_models_is_named(tmp_path, joined):
    path = copy_of(joined, tmp_path) / "dict.en.txt"
    path.write_text(path.read_text(encoding="utf-8") + "extra 1\n", encoding="utf-8")
    with pytest.raises(ExportError, match="not this model's|differ"):
        fairseq_to_transformer(tmp_path / "m")


def forget_languages(pt: Path) -> Path:
    """The checkpoint ``pt`` rewritten as fairseq-train without -s/-t saves it: no languages."""
    found = torch.load(pt, weights_only=False)  # the test's own file
    found["cfg"]["model"] = argparse.Namespace(**options(source_lang=None, target_lang=None))
    found["cfg"]["task"] = {"_name": "translation", "source_lang": None, "target_lang": None}
    torch.save(found, pt)
    return pt


def test_languages_fairseq_train_took_from_its_data_are_given_on_the_command_line(
    tmp_path, joined, capsys
):
    """fairseq-train without --source-lang/--target-lang records none (it read them off its data
    directory's file names): the import says which options name the dictionaries."""
    model = copy_of(joined, tmp_path)
    pt = forget_languages(model / "checkpoint_best.pt")
    with pytest.raises(ExportError) as info:
        import_fairseq(model, tmp_path / "refused")
    assert str(info.value) == (
        f"{pt}: source_lang / target_lang not recorded (fairseq-train took them from its data "
        "directory): give --source-lang and --target-lang (beside it: dict.en.txt, dict.es.txt)"
    )
    assert not (tmp_path / "refused").exists()
    given = ["--source-lang", "en", "--target-lang", "es"]
    assert run_cli(capsys, "import", model, "--out", tmp_path / "out", *given)[0] == 0
    ours, _ = load_translator(tmp_path / "out")
    expected, _ = fairseq_to_transformer(joined[0])  # the same model, its languages recorded
    for (name, a), (_, b) in zip(ours.state_dict().items(), expected.state_dict().items()):
        assert torch.equal(a, b), name
    code, _, err = run_cli(capsys, "import", joined[0], "--out", tmp_path / "o2", "--target-lang", "de")  # fmt: skip
    assert code != 0 and not (tmp_path / "o2").exists()
    assert err.strip().endswith("--target-lang de: the checkpoint records es")
    assert len(err.strip().splitlines()) == 1


def test_numpy_scalars_and_omegaconf_containers_load_as_plain_data(tmp_path, joined, monkeypatch):
    """What some fairseq versions pickle beside the weights: a metric as a numpy scalar, the
    options as omegaconf containers (stand-ins that keep their contents and run nothing)."""
    import numpy as np

    from aiayn.export import fairseq_load

    class DictConfig:  # pickled under omegaconf's name, with its __getstate__'s layout
        __module__, __qualname__ = "omegaconf.dictconfig", "DictConfig"

        def __init__(self, content: dict) -> None:
            self.__dict__ = {"_metadata": None, "_parent": None, "_content": content}

    path = copy_of(joined, tmp_path) / "checkpoint_best.pt"
    found = torch.load(path, weights_only=False)  # our own fixture
    found["extra_state"] = {"val_loss": np.float64(4.5), "best": np.float32(1.0)}
    found["cfg"] = DictConfig({"model": found["cfg"]["model"], "task": found["cfg"]["task"]})
    module = type(np)("omegaconf.dictconfig")  # pickle finds the class by its module's name
    module.DictConfig = DictConfig
    monkeypatch.setitem(sys.modules, "omegaconf", type(np)("omegaconf"))
    monkeypatch.setitem(sys.modules, "omegaconf.dictconfig", module)
    torch.save(found, path)
    loaded = fairseq_load.read_checkpoint(path)
    assert loaded["extra_state"] == {"val_loss": 4.5, "best": 1.0}
    assert fairseq_load.model_options(loaded, path)["encoder_embed_dim"] == D


# --- Moses tokens + subword-nmt BPE codes (fairseq's WMT16 EN-DE download)


def moses_pieces(lines: list[str], lang: str, codes: Path) -> list[list[str]]:
    """What fairseq's hub feeds its dictionary: sacremoses (dash splits, escapes) then
    subword-nmt's apply_bpe, split at spaces."""
    from sacremoses import MosesTokenizer
    from subword_nmt.apply_bpe import BPE

    tokenizer = MosesTokenizer(lang)
    with open(codes, encoding="utf-8") as f:
        bpe = BPE(f)
    tokens = (tokenizer.tokenize(x, aggressive_dash_splits=True, return_str=True) for x in lines)
    return [bpe.process_line(t).split() for t in tokens]


ESCAPED = 'Dijo "sí" & <se fue> al pre-juicio.'  # Moses escapes and splits: &quot; @-@ ...


def write_bpe_directory(root: Path) -> tuple[dict, list[str]]:
    """fairseq's WMT16 layout: model.pt, one joined dictionary as dict.en.txt and dict.es.txt,
    and bpecodes learned by subword-nmt on Moses tokens of 400 lines a side. Its tensors and
    the dictionary's symbols."""
    from sacremoses import MosesTokenizer
    from subword_nmt.learn_bpe import learn_bpe

    root.mkdir(parents=True)
    en, es = corpus_lines("train", 0, 400), [*corpus_lines("train", 1, 400), ESCAPED]
    tokens = [MosesTokenizer("en").tokenize(x, aggressive_dash_splits=True, return_str=True) for x in en]  # fmt: skip
    tokens += [MosesTokenizer("es").tokenize(x, aggressive_dash_splits=True, return_str=True) for x in es]  # fmt: skip
    with open(root / "bpecodes", "w", encoding="utf-8") as codes:
        learn_bpe(io.StringIO("\n".join(tokens)), codes, 300)
    split = moses_pieces(en, "en", root / "bpecodes") + moses_pieces(es, "es", root / "bpecodes")
    counts = Counter(p for pieces in split for p in pieces).most_common()
    listing = "".join(f"{piece} {n}\n" for piece, n in counts)
    (root / "dict.en.txt").write_text(listing, "utf-8")
    (root / "dict.es.txt").write_text(listing, "utf-8")
    symbols = ["<s>", "<pad>", "</s>", "<unk>", *(piece for piece, _ in counts)]
    state = random_state((len(symbols), len(symbols)), shared=True, pre=False)
    save_checkpoint(root / "model.pt", state, options())
    return state, symbols


@pytest.fixture(scope="module")
def bpe_import(tmp_path_factory) -> tuple[Path, Path, dict, list[str]]:
    """A fairseq directory with bpecodes (no SentencePiece model), imported with nothing else
    given: (its directory, the checkpoint, its tensors, its dictionary)."""
    root = tmp_path_factory.mktemp("wmt16") / "model"
    state, symbols = write_bpe_directory(root)
    assert main(["import", str(root), "--out", str(root.parent / "ckpt")]) in (None, 0)
    return root, root.parent / "ckpt", state, symbols


def test_bpe_codes_split_the_text_as_fairseqs_hub_does(bpe_import):
    """The pieces fed to the model are sacremoses' + subword-nmt's, in fairseq's ids: the
    imported model's log-probabilities equal fairseq's forward pass on those ids."""
    root, ckpt, state, symbols = bpe_import
    model, vocab = load_translator(ckpt)
    assert json.loads((ckpt / "moses-bpe.json").read_text("utf-8"))["target_lang"] == "es"
    ids = {p: i for i, p in enumerate(symbols)}
    en, es = corpus_lines("test", 0, 4), corpus_lines("test", 1, 4)
    theirs_en = moses_pieces(en, "en", root / "bpecodes")
    theirs_es = moses_pieces(es, "es", root / "bpecodes")
    for line, want, target, want_target in zip(en, theirs_en, es, theirs_es):
        src, tgt = vocab.encode_source(line), vocab.encode_target(target) + [vocab.eos_id]
        assert [vocab.id_to_piece(i) for i in src] == [p if p in ids else "<unk>" for p in want] + ["</s>"]  # fmt: skip
        expected = fairseq_log_probs(
            state,
            [ids.get(p, 3) for p in want] + [EOS],
            [ids.get(p, 3) for p in want_target] + [EOS],
            pre=False,
        )
        with torch.no_grad():
            logits = model(torch.tensor([src]), torch.tensor([[vocab.bos_id, *tgt[:-1]]]))
        ours = torch.log_softmax(logits[0].double(), -1)[torch.arange(len(tgt)), tgt]
        torch.testing.assert_close(ours, expected, atol=1e-4, rtol=0)


def test_bpe_text_round_trips_through_moses(bpe_import):
    """Encoding then decoding gives the Moses-detokenized text: the continuations joined, the
    escapes undone (lines the codes were learned on: every piece is in the dictionary)."""
    from sacremoses import MosesDetokenizer, MosesTokenizer

    _, ckpt, _, _ = bpe_import
    _, vocab = load_translator(ckpt)
    lines = [*corpus_lines("train", 1, 40), ESCAPED]
    tokenizer, detokenizer = MosesTokenizer("es"), MosesDetokenizer("es")
    for line in lines:
        ids = vocab.encode_target(line)
        assert vocab.unk_id not in ids
        expected = detokenizer.detokenize(tokenizer.tokenize(line, aggressive_dash_splits=True))
        assert vocab.decode(ids) == expected
    assert vocab.decode(vocab.encode_target(lines[0])) == lines[0]
    pieces = " ".join(vocab.id_to_piece(i) for i in vocab.encode_target(ESCAPED))
    assert "&quot; sí &quot; &amp; &lt;" in pieces.replace("@@ ", "")  # as the codes saw it
    assert "pre @-@ juicio" in pieces.replace("@@ ", "")
    assert any("@@" in vocab.id_to_piece(i) for i in vocab.encode_target(" ".join(lines[:5])))


def test_an_imported_bpe_model_translates_into_detokenized_text(bpe_import):
    """Its outputs are text: pieces joined at ``@@`` and detokenized (a random model's drawn
    outputs, which are full of continuations; its beam repeats one word)."""
    from sacremoses import MosesDetokenizer

    from aiayn import Translator

    _, ckpt, _, _ = bpe_import
    with Translator(ckpt) as translator:
        out = translator.translate(corpus_lines("test", 0, 2), sample=True, seed=1, nbest=2)
    pieces = [p for t in out for p in t.tokens]
    assert any(p.endswith("@@") for p in pieces)  # there were continuations to join
    for t in out:
        words = (" ".join(t.tokens) + " ").replace("@@ ", "").split()
        assert t.text == MosesDetokenizer("es").detokenize(words) and "@@" not in t.text


def one_line_error(call) -> str:
    from aiayn.errors import UserError

    with pytest.raises(UserError) as info:
        call()
    assert "\n" not in str(info.value)
    return str(info.value)


def test_what_bpe_pieces_cannot_do_is_refused_in_one_line(bpe_import, tmp_path):
    """Word alignments, constraints, glossaries, markup (Moses' tokens are not the text's
    words, the pieces have no word marks) and training data (SentencePiece only)."""
    from aiayn import Translator
    from aiayn.data.prepare import prepare_corpus
    from aiayn.text.marked import MarkupOutputs
    from aiayn.text.placeholders import placeholder_pattern

    root, ckpt, _, _ = bpe_import
    with Translator(ckpt) as translator:
        said = one_line_error(lambda: translator.translate(["Hola."], alignments=True))
        assert "Moses tokens + subword-nmt" in said and "alignments" in said
        said = one_line_error(lambda: translator.translate(["Hola."], constraints=[["Dios"]]))
        assert "constraints" in said
        assert "glossary" in one_line_error(lambda: translator.request(glossary={"God": "Dios"}))
        assert "Moses" in one_line_error(
            lambda: MarkupOutputs("xml", placeholder_pattern(markup=True, built_in=False))(
                None, ["<b>a</b>"], translator.vocab, None, progress=None, on_truncate=None
            )
        )
    pair = (root / "dict.en.txt", root / "dict.es.txt")
    said = one_line_error(lambda: prepare_corpus({"train": pair}, tmp_path / "d", vocab=ckpt))
    assert "moses" in said.lower() and "SentencePiece" in said and not (tmp_path / "d").exists()


def test_bpe_codes_elsewhere_are_given_and_bad_ones_named_with_their_line(bpe_import, tmp_path):
    root = Path(shutil.copytree(bpe_import[0], tmp_path / "m"))
    codes = Path(shutil.move(root / "bpecodes", tmp_path / "my.codes"))
    said = one_line_error(lambda: import_fairseq(root, tmp_path / "c"))
    assert "no SentencePiece *.model and no BPE codes" in said and "--bpe-codes" in said
    assert main(["import", str(root), "--out", str(tmp_path / "c"), "--bpe-codes", str(codes)]) in (None, 0)  # fmt: skip
    assert (tmp_path / "c" / "bpecodes").read_bytes() == codes.read_bytes()
    codes.write_text("#version: 0.2\na b\nthree words here\n", "utf-8")
    said = one_line_error(lambda: import_fairseq(root, tmp_path / "d", bpe_codes=codes))
    assert f"{codes}:3" in said and not (tmp_path / "d").exists()


def test_moses_settings_the_checkpoint_records_are_kept(bpe_import, tmp_path):
    """A model trained with --moses-no-dash-splits --moses-no-escape is read as fairseq's hub
    reads it: dashes whole, quotes unescaped."""
    root = Path(shutil.copytree(bpe_import[0], tmp_path / "m"))
    save_checkpoint(root / "model.pt", bpe_import[2], options(moses_no_dash_splits=True, moses_no_escape=True))  # fmt: skip
    _, vocab = load_translator(import_fairseq(root, tmp_path / "c"))
    joined = " ".join(vocab.split(ESCAPED, "target")).replace("@@ ", "")
    assert joined == 'Dijo " sí " & < se fue > al pre-juicio .'
    assert vocab.fingerprint != load_translator(bpe_import[1])[1].fingerprint


def test_bpe_codes_of_a_checkpoint_without_languages_name_the_dictionaries(bpe_import, tmp_path):
    """The BPE codes' Moses languages are the checkpoint's: without them the refusal names the
    options and the dictionaries of the checkpoint's own directory, before anything is written."""
    model = Path(shutil.copytree(bpe_import[0], tmp_path / "m"))
    forget_languages(model / "model.pt")
    with pytest.raises(ExportError) as info:
        import_fairseq(model, tmp_path / "refused")
    assert str(info.value).endswith(
        "give --source-lang and --target-lang (beside it: dict.en.txt, dict.es.txt)"
    )
    assert not (tmp_path / "refused").exists()
    out = import_fairseq(model, tmp_path / "out", languages=("en", "es"))
    assert json.loads((out / "moses-bpe.json").read_text("utf-8"))["target_lang"] == "es"
