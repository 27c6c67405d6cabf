"""``aiayn import`` of Marian's own format (``model.npz`` + ``decoder.yml`` + vocabularies): a
random model in Marian's layout, written here with numpy, imported, gives the log-probabilities
that a numpy forward pass written from Marian's definitions gives (post-norm, its sinusoids,
scaled embeddings, a zero start vector, a tied output layer with its bias); tied and separate
vocabularies, YAML tables and SentencePiece models; what it cannot represent is refused in one
line naming the option. Marian itself is the oracle of ``test_marian_oracle.py``."""

import json
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm
import torch
import yaml
from _export_models import corpus_lines

from aiayn.checkpoint import load_translator
from aiayn.cli.main import main
from aiayn.export.common import ExportError
from aiayn.export.marian_npz import import_marian_npz, npz_to_transformer

D, HEADS, FFN = 16, 2, 24


def train_spm(lines: list[str], prefix: Path, size: int) -> Path:
    """A SentencePiece model with Marian's ids (</s> 0, <unk> 1, no bos or pad), as Marian trains."""
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_prefix=str(prefix),
        vocab_size=size,
        eos_id=0,
        unk_id=1,
        bos_id=-1,
        pad_id=-1,
        minloglevel=2,
        num_threads=1,
    )
    return prefix.with_suffix(".model").rename(prefix.with_suffix(".spm"))  # Marian's suffix


def layer(rng: np.random.Generator, name: str, context: bool) -> dict[str, np.ndarray]:
    """One layer's tensors under Marian's names and shapes (W: (in, out), b and LN: (1, n))."""

    def w(*shape: int) -> np.ndarray:
        return rng.normal(0, 0.3, shape).astype(np.float32)

    out = {}
    for part in ("self", "context") if context else ("self",):
        for x in "qkvo":
            out[f"{name}_{part}_W{x}"], out[f"{name}_{part}_b{x}"] = w(D, D), w(1, D)
        out[f"{name}_{part}_Wo_ln_scale"] = 1 + w(1, D)
        out[f"{name}_{part}_Wo_ln_bias"] = w(1, D)
    out[f"{name}_ffn_W1"], out[f"{name}_ffn_b1"] = w(D, FFN), w(1, FFN)
    out[f"{name}_ffn_W2"], out[f"{name}_ffn_b2"] = w(FFN, D), w(1, D)
    out[f"{name}_ffn_ffn_ln_scale"], out[f"{name}_ffn_ffn_ln_bias"] = 1 + w(1, D), w(1, D)
    return out


def write_model(
    directory: Path, sizes: tuple[int, int], tied: bool, options: dict | None = None, seed: int = 0
) -> dict[str, np.ndarray]:
    """A random 2+2-layer Marian transformer as ``directory/model.npz``; its arrays."""
    rng = np.random.default_rng(seed)
    opts = {
        "type": "transformer", "dim-emb": D, "enc-depth": 2, "dec-depth": 2,
        "transformer-heads": HEADS, "transformer-dim-ffn": FFN,
        "transformer-ffn-activation": "swish", "transformer-postprocess": "dan",
        "transformer-preprocess": "", "transformer-postprocess-emb": "d",
        "tied-embeddings-all": tied, "tied-embeddings": True, "transformer-dropout": 0.1,
        **(options or {}),
    }  # fmt: skip
    arrays = {}
    if tied:
        arrays["Wemb"] = rng.normal(0, 0.5, (sizes[0], D)).astype(np.float32)
    else:
        arrays["encoder_Wemb"] = rng.normal(0, 0.5, (sizes[0], D)).astype(np.float32)
        arrays["decoder_Wemb"] = rng.normal(0, 0.5, (sizes[1], D)).astype(np.float32)
    arrays["decoder_ff_logit_out_b"] = rng.normal(0, 1, (1, sizes[1])).astype(np.float32)
    for i in (1, 2):
        arrays |= layer(rng, f"encoder_l{i}", False) | layer(rng, f"decoder_l{i}", True)
    text = yaml.safe_dump(opts).encode() + b"\0"
    arrays["special:model.yml"] = np.frombuffer(text, dtype=np.int8)
    np.savez(directory / "model.npz", **arrays)
    return arrays


# --- Marian's forward pass, from its definitions (transformer.h), in numpy -------------------


def positions(length: int) -> np.ndarray:
    """Marian's sinusoids: sines then cosines, timescales 10000^(i / (D/2 - 1))."""
    scaled = np.arange(length)[:, None] * np.exp(-np.arange(D // 2) * np.log(1e4) / (D // 2 - 1))
    return np.concatenate([np.sin(scaled), np.cos(scaled)], axis=1)


def norm(a: dict, name: str, x: np.ndarray) -> np.ndarray:
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return a[f"{name}_ln_scale"] * (x - mean) / np.sqrt(var + 1e-9) + a[f"{name}_ln_bias"]


def attend(a: dict, name: str, q_in: np.ndarray, kv_in: np.ndarray, causal: bool) -> np.ndarray:
    """Post-norm multi-head attention: norm(q_in + Wo(heads))."""

    def heads(x: np.ndarray, w: str) -> np.ndarray:  # (L, D) -> (HEADS, L, D / HEADS)
        return (
            (x @ a[f"{name}_W{w}"] + a[f"{name}_b{w}"])
            .reshape(len(x), HEADS, -1)
            .transpose(1, 0, 2)
        )

    q, k, v = heads(q_in, "q"), heads(kv_in, "k"), heads(kv_in, "v")
    scores = q @ k.transpose(0, 2, 1) / np.sqrt(D // HEADS)
    if causal:
        scores = np.where(np.tril(np.ones(scores.shape[1:], bool)), scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    out = (p / p.sum(-1, keepdims=True) @ v).transpose(1, 0, 2).reshape(len(q_in), D)
    return norm(a, f"{name}_Wo", q_in + out @ a[f"{name}_Wo"] + a[f"{name}_bo"])


def feed_forward(a: dict, name: str, x: np.ndarray) -> np.ndarray:
    h = x @ a[f"{name}_W1"] + a[f"{name}_b1"]
    h = h / (1 + np.exp(-h))  # swish
    return norm(a, f"{name}_ffn", x + h @ a[f"{name}_W2"] + a[f"{name}_b2"])


def marian_log_probs(a: dict, src: list[int], tgt: list[int]) -> np.ndarray:
    """log P(tgt[t] | tgt[:t], src) for each t, in Marian ids (src and tgt end with </s> = 0)."""
    src_emb, tgt_emb = (
        (a["Wemb"], a["Wemb"]) if "Wemb" in a else (a["encoder_Wemb"], a["decoder_Wemb"])
    )
    x = src_emb[src] * np.sqrt(D) + positions(len(src))
    for i in (1, 2):
        x = feed_forward(a, f"encoder_l{i}_ffn", attend(a, f"encoder_l{i}_self", x, x, False))
    start = np.zeros((1, D))  # Marian's decoder starts from a zero vector, not a token
    y = np.concatenate([start, tgt_emb[tgt[:-1]]]) * np.sqrt(D) + positions(len(tgt))
    for i in (1, 2):
        y = attend(a, f"decoder_l{i}_self", y, y, True)
        y = feed_forward(a, f"decoder_l{i}_ffn", attend(a, f"decoder_l{i}_context", y, x, False))
    logits = y @ tgt_emb.T + a["decoder_ff_logit_out_b"]
    logits -= logits.max(-1, keepdims=True)
    lp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return lp[np.arange(len(tgt)), tgt]


# --- Fixtures: Marian model directories of the three kinds --------------------------------


def write_directory(root: Path, kind: str, options: dict | None = None) -> tuple[dict, dict, dict]:
    """A Marian model directory of ``kind``: "tied" (one built-in .spm vocabulary, all
    embeddings tied), "separate" (a source and a target .spm, their own embeddings) or "yml"
    (OPUS-MT's: one YAML table, the text split by source.spm/target.spm). Its arrays and its
    (source, target) tables piece -> Marian id."""
    root.mkdir(parents=True, exist_ok=True)
    en, es = corpus_lines("train", 0, 800), corpus_lines("train", 1, 800)
    if kind == "separate":
        names = [train_spm(en, root / "src", 150).name, train_spm(es, root / "tgt", 170).name]
    else:
        names = [train_spm(en + es, root / "joint", 200).name] * 2
    tables = []
    for name in names:
        sp = spm.SentencePieceProcessor(model_file=str(root / name))
        tables.append({sp.id_to_piece(i): i for i in range(sp.get_piece_size())})
    if kind == "yml":  # OPUS-MT: the table as YAML (every piece but the last ten), spm beside
        for side in ("source.spm", "target.spm"):
            (root / side).write_bytes((root / names[0]).read_bytes())
        table = {p: i for p, i in tables[0].items() if i < len(tables[0]) - 10}
        (root / "vocab.yml").write_text(yaml.safe_dump(table, allow_unicode=True), encoding="utf-8")
        names, tables = ["vocab.yml"] * 2, [table, table]
    arrays = write_model(root, (len(tables[0]), len(tables[1])), kind != "separate", options)
    decoder = {"models": ["/training/run/model.npz"], "vocabs": names, "beam-size": 4}
    (root / "decoder.yml").write_text(yaml.safe_dump(decoder), encoding="utf-8")
    return arrays, tables[0], tables[1]


@pytest.fixture(scope="module", params=["tied", "separate", "yml"])
def marian_dir(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param) / "model"
    return root, *write_directory(root, request.param)


def test_imported_model_gives_marians_log_probs(marian_dir, tmp_path):
    """Teacher-forced log-probabilities of the imported checkpoint (``aiayn import``, then loaded
    as any checkpoint) equal the numpy forward pass of Marian's definitions, token by token."""
    root, arrays, source, target = marian_dir
    assert main(["import", str(root), "--out", str(tmp_path / "ckpt")]) in (None, 0)
    model, vocab = load_translator(tmp_path / "ckpt")
    assert model.cfg.positional == "marian" and model.cfg.share_embeddings == ("Wemb" in arrays)
    for en, es in zip(corpus_lines("test", 0, 6), corpus_lines("test", 1, 6)):
        src, tgt = vocab.encode_source(en), vocab.encode_target(es) + [vocab.eos_id]
        theirs = marian_log_probs(
            arrays,
            [source.get(vocab.id_to_piece(i), 1) for i in src[:-1]] + [0],
            [target.get(vocab.id_to_piece(i), 1) for i in tgt[:-1]] + [0],
        )
        with torch.no_grad():
            logits = model(torch.tensor([src]), torch.tensor([[vocab.bos_id, *tgt[:-1]]]))
        ours = torch.log_softmax(logits[0].double(), -1)[torch.arange(len(tgt)), tgt]
        np.testing.assert_allclose(ours.numpy(), theirs, atol=1e-4)


@pytest.mark.slow
def test_decoder_ymls_beam_and_normalisation_are_the_checkpoints_marian_defaults(tmp_path, capsys):
    """decoder.yml's beam-size and normalize become the checkpoint's defaults under marian rules
    (what marian-decoder -c decoder.yml searches with); options given still win."""
    root = tmp_path / "m"
    write_directory(root, "tied")
    config = yaml.safe_load((root / "decoder.yml").read_text(encoding="utf-8"))
    config["normalize"] = 0.6
    (root / "decoder.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    assert main(["import", str(root), "--out", str(tmp_path / "ckpt")]) in (None, 0)
    meta = json.loads((tmp_path / "ckpt" / "meta.json").read_text(encoding="utf-8"))
    assert meta["search_defaults"] == {"marian": {"beam": 4, "alpha": 0.6}}
    capsys.readouterr()
    sources = tmp_path / "test.en"
    sources.write_text("\n".join(corpus_lines("test", 0, 4)) + "\n", encoding="utf-8")

    def nbest(*options: str) -> str:
        ckpt = str(tmp_path / "ckpt")
        main(["translate", "--checkpoint", ckpt, "--input", str(sources), "--nbest", "4", *options])
        return capsys.readouterr().out

    own = nbest("--search-rules", "marian")
    assert own == nbest("--search-rules", "marian", "--beam", "4", "--alpha", "0.6")
    assert own != nbest("--search-rules", "marian", "--beam", "4", "--alpha", "0")


def test_separate_vocabularies_join_into_one_table(tmp_path):
    """Separate source and target tables become their union: a piece only the target has
    embeds on the source side as the source's <unk>, one only the source has is never output."""
    arrays, source, target = write_directory(tmp_path / "m", "separate")
    model, layout, _ = npz_to_transformer(tmp_path / "m")
    pieces = layout.pieces
    assert set(pieces[4:]) == (set(source) | set(target)) - {"</s>", "<unk>"}
    target_only = next(i for i, p in enumerate(pieces) if p in target and p not in source)
    source_only = next(i for i, p in enumerate(pieces) if p in source and p not in target)
    scale = arrays["encoder_Wemb"][source["<unk>"]]  # compared up to the model's permutation
    src_row = model.src_embed.tokens.weight[target_only].detach().numpy()
    np.testing.assert_allclose(np.sort(src_row), np.sort(scale), rtol=1e-6)
    bias = model.generator.bias.detach()
    assert bias[source_only] == -100.0 and bias[0] == bias[2] == -100.0  # pad and bos too
    assert bias[3] == pytest.approx(float(arrays["decoder_ff_logit_out_b"][0, 0]))  # </s>


def object_array_npz(root: Path) -> None:
    """The model's npz with one array of Python objects added (loading it would unpickle)."""
    arrays = dict(np.load(root / "model.npz"))
    arrays["evil"] = np.array([{"a": 1}], dtype=object)
    np.savez(root / "model.npz", **arrays)


def second_model(root: Path) -> None:
    (root / "decoder.yml").write_text("models: [a.npz, b.npz]\nvocabs: [v.spm, v.spm]\n")


def factored_vocabulary(root: Path) -> None:
    (root / "vocab.fsv").write_text("</s> : 0\n")
    (root / "decoder.yml").write_text("models: [model.npz]\nvocabs: [vocab.fsv, vocab.fsv]\n")


def untied_output(root: Path) -> None:
    arrays = dict(np.load(root / "model.npz"))
    arrays["decoder_ff_logit_out_W"] = arrays["Wemb"].T.copy()
    np.savez(root / "model.npz", **arrays)


@pytest.mark.parametrize(
    ("options", "damage", "message"),
    [
        ({"transformer-decoder-autoreg": "rnn", "dec-cell": "ssru"}, None, "transformer-decoder-autoreg: 'rnn' (an RNN/SSRU"),
        ({"transformer-decoder-autoreg": "average-attention"}, None, "average-attention"),
        ({"transformer-preprocess": "n", "transformer-postprocess": "da"}, None, "transformer-preprocess: 'n' (pre-norm"),
        ({"type": "s2s"}, None, "type: 's2s' cannot be represented"),
        ({"transformer-train-position-embeddings": True}, None, "(learned positions)"),
        ({"transformer-ffn-activation": "tanh"}, None, "transformer-ffn-activation 'tanh'"),
        ({"transformer-decoder-dim-ffn": 48}, None, "transformer-decoder-dim-ffn 48 differ"),
        (None, untied_output, "an output layer of its own (tied-embeddings: false)"),
        (None, object_array_npz, "not a plain numpy .npz"),
        (None, second_model, "models lists 2 models"),
        (None, factored_vocabulary, "a factored vocabulary cannot be represented"),
    ],
)  # fmt: skip
def test_what_cannot_be_represented_is_refused_in_one_line(tmp_path, options, damage, message):
    write_directory(tmp_path / "m", "tied", options)
    if damage is not None:
        damage(tmp_path / "m")
    with pytest.raises(ExportError) as e:
        import_marian_npz(tmp_path / "m", tmp_path / "out")
    assert message in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "out").exists()
