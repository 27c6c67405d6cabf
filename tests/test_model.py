"""The model of section 3: masking, fused vs reference attention, the reference step, counts, tying."""

import inspect

import pytest
import torch
from _tiny_models import PAD, VARIANTS, batch, make

from aiayn import ModelConfig, Transformer, count_parameters
from aiayn.model import attention_mask, sinusoidal_encoding


@pytest.mark.parametrize("overrides", VARIANTS)
def test_causality_future_targets_do_not_change_earlier_logits(overrides):
    model = make(**overrides)
    src, tgt = batch()
    base = model(src, tgt)
    for i in (1, 4, 7):
        changed = tgt.clone()
        changed[:, i:] = torch.randint(4, 100, changed[:, i:].shape)
        out = model(src, changed)
        assert torch.allclose(out[:, :i], base[:, :i], atol=1e-6)
        assert not torch.allclose(out[:, i:], base[:, i:], atol=1e-3)  # the change is visible


@pytest.mark.parametrize("overrides", VARIANTS)
def test_source_padding_is_invisible(overrides):
    model = make(**overrides)
    src, tgt = batch()
    base = model(src, tgt)
    # Whatever lies under the padding (here: the vector the pad id embeds to) is never seen.
    with torch.no_grad():
        model.src_embed.tokens.weight[PAD].normal_()
    # (the tied output layer's logit *for* the pad id changes with it; no other logit does)
    assert torch.allclose(model(src, tgt)[..., 1:], base[..., 1:], atol=1e-5)
    # The same sentences padded to a wider batch give the same outputs.
    wider = torch.cat([src, torch.full((3, 5), PAD)], dim=1)
    assert torch.allclose(model(wider, tgt)[..., 1:], base[..., 1:], atol=1e-5)
    # Sentences in a batch do not see each other.
    other = src.clone()
    other[0, 7] = 5 if src[0, 7] != 5 else 6
    out = model(other, tgt)[..., 1:]
    base = base[..., 1:]
    assert torch.allclose(out[1:], base[1:], atol=1e-5)
    assert not torch.allclose(out[0], base[0], atol=1e-4)


@pytest.mark.parametrize("overrides", VARIANTS)
def test_fused_attention_equals_reference(overrides):
    model = make(**overrides)
    src, tgt = batch()
    fused = model(src, tgt)
    encoder, decoder_self, encoder_decoder = [], [], []  # each gets the weights of every layer
    memory = model.encode(src, weights=encoder)
    states = model.decode(tgt, memory, model.src_mask(src), weights=(decoder_self, encoder_decoder))
    reference = model.generator(states)
    assert torch.allclose(fused, reference, atol=1e-5)
    assert len(encoder) == len(decoder_self) == len(encoder_decoder) == 2
    weights = encoder_decoder[0]  # (B, h, T, S)
    assert weights is not None and weights.shape == (3, model.cfg.h, 8, 9)
    assert torch.allclose(weights.sum(-1), torch.ones(3, model.cfg.h, 8), atol=1e-5)
    assert torch.all(weights[2, :, :, 4:] == 0)  # padding gets no attention


def test_attention_weights_are_returned_and_never_kept_on_the_modules():
    model = make()
    src, tgt = batch()
    weights = model.attention_weights(src[:1], tgt[:1])
    assert [len(w) for w in weights.values()] == [2, 2, 2]
    assert weights["encoder-decoder attention"][1].shape == (model.cfg.h, 8, 9)
    kept = [
        name
        for module in model.modules()
        for name, value in vars(module).items()
        if isinstance(value, torch.Tensor)
    ]
    assert kept == []  # no call leaves a tensor that a later call could read
    assert "output" not in inspect.signature(model.decode_step).parameters


def test_reference_decode_step_reproduces_forward_through_reorders_and_leaving_sentences():
    model = make()
    src, tgt = batch()
    cache = model.new_cache(model.encode(src), model.src_mask(src))
    model.decode_step(tgt[:, :4], cache)
    rows = torch.tensor([1, 1, 1])  # sentence 1 fans out to 3 beams, sentence 0 leaves
    cache.select(rows, sentences=torch.tensor([1]))
    logits = model.decode_step(tgt[rows, 4:5], cache)
    assert torch.allclose(logits, model(src[rows], tgt[rows, :5])[:, 4], atol=1e-5)


def test_output_mask_selects_positions():
    model = make()
    src, tgt = batch()
    keep = torch.rand(tgt.shape) > 0.5
    assert torch.allclose(model(src, tgt, output_mask=keep), model(src, tgt)[keep], atol=1e-6)


# Hand counts. Per layer, with d = d_model, q = h*d_k, v = h*d_v:
#   self-attention  = d(2q+v) + (2q+v) + v*d + d      (W_Q, W_K, W_V, W_O with biases)
#   enc-dec attn    = the same numbers (W_Q, W_KV, W_O)
#   FFN             = d*d_ff + d_ff + d_ff*d + d
#   LayerNorm       = 2d each (2 per encoder layer, 3 per decoder layer)
# base: attention 4*512*512 + 4*512 = 1,050,624; FFN 2*512*2048 + 2048 + 512 = 2,099,712
#   encoder layer 1,050,624 + 2,099,712 + 2,048 = 3,152,384  x6 = 18,914,304
#   decoder layer 2*1,050,624 + 2,099,712 + 3,072 = 4,204,032 x6 = 25,224,192
#   shared embedding 37,000 * 512 = 18,944,000             total = 63,082,496
# big: attention 4*1024^2 + 4*1024 = 4,198,400; FFN 2*1024*4096 + 4096 + 1024 = 8,393,728
#   encoder 6*(4,198,400 + 8,393,728 + 4,096) = 75,577,344
#   decoder 6*(2*4,198,400 + 8,393,728 + 6,144) = 100,780,032
#   embedding 37,000 * 1024 = 37,888,000                   total = 214,245,376
# tiny (d 32, d_ff 64, h 4, N 2, vocab 100): attention 4*32*32 + 4*32 = 4,224;
#   FFN 2*32*64 + 64 + 32 = 4,192; encoder 2*(4,224 + 4,192 + 128) = 17,088;
#   decoder 2*(8,448 + 4,192 + 192) = 25,664; embedding 3,200  total = 45,952
@pytest.mark.parametrize(
    "name, expected", [("base", 63_082_496), ("big", 214_245_376), ("tiny", 45_952)]
)
def test_parameter_counts(name, expected):
    cfg = ModelConfig.preset(name)
    assert count_parameters(cfg) == expected
    if name != "big":  # instantiating big is slow; the formula is checked on the others
        model = Transformer(cfg)
        assert sum(p.numel() for p in model.parameters()) == expected


@pytest.mark.parametrize("overrides", VARIANTS)
def test_count_parameters_matches_module(overrides):
    cfg = ModelConfig.preset("tiny", **overrides)
    assert count_parameters(cfg) == sum(p.numel() for p in Transformer(cfg).parameters())


def test_shared_matrix_stays_tied_after_an_update():
    model = make()
    model.train()
    emb = model.src_embed.tokens.weight
    assert emb is model.tgt_embed.tokens.weight is model.generator.weight
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    src, tgt = batch()
    before = emb.detach().clone()
    model(src, tgt).sum().backward()
    opt.step()
    assert not torch.equal(before, emb)
    assert model.generator.weight.data_ptr() == model.src_embed.tokens.weight.data_ptr()
    assert torch.equal(model.generator.weight, model.tgt_embed.tokens.weight)


def test_sinusoidal_encoding_values():
    pe = sinusoidal_encoding(50, 8)
    assert pe[0, 0] == 0 and pe[0, 1] == 1
    # PE(pos, 2i) = sin(pos / 10000^(2i/d)): pos 3, i 1, d 8 -> sin(3 / 10)
    assert pe[3, 2].item() == pytest.approx(torch.sin(torch.tensor(0.3)).item(), abs=1e-6)
    assert pe[7, 5].item() == pytest.approx(
        torch.cos(torch.tensor(7 / 10000**0.5)).item(), abs=1e-6
    )


def test_embedding_scaled_by_sqrt_d_model():
    model = make(P_drop=0.0)
    ids = torch.tensor([[5]])
    expected = model.src_embed.tokens.weight[5] * 32**0.5 + model.src_embed.pe[0]
    assert torch.allclose(model.src_embed(ids)[0, 0], expected)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"d_model": 30, "h": 4}, "not divisible"),
        ({"d_ff": -1}, "d_ff"),
        ({"P_drop": 1.5}, "P_drop"),
        ({"norm": "sandwich"}, "norm"),
    ],
)
def test_invalid_configs_are_rejected(overrides, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(**overrides)


def test_unknown_preset_names_the_choices():
    with pytest.raises(ValueError, match="unknown preset 'C-N3'.*base"):
        ModelConfig.preset("C-N3")


def test_row_b_sets_d_k_independently():
    cfg = ModelConfig.preset("B-dk16")
    assert (cfg.resolved_d_k, cfg.resolved_d_v) == (16, 64)
    assert (
        ModelConfig(d_model=30, h=4, d_k=7, d_v=9).resolved_d_k == 7
    )  # explicit widths lift divisibility


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [None, 0, 2])
@pytest.mark.parametrize("T", [1, 3, 6])
def test_attention_mask_is_the_definition(causal, window, T):
    """Queries are the last T of S = 6 positions; checked cell by cell against the rules."""
    S = 6
    keys = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])[:, None, None, :]  # (2, 1, 1, S)
    for padding in (None, keys):
        mask = attention_mask(T, S, torch.device("cpu"), causal=causal, window=window, keys=padding)
        if not causal and window is None and padding is None:
            assert mask is None
            continue
        expected = torch.zeros(2, 1, T, S, dtype=torch.bool)
        for b in range(2):
            for q in range(T):
                i = S - T + q
                for j in range(S):
                    ok = (not causal or j <= i) and (window is None or abs(i - j) <= window)
                    if padding is not None:
                        ok = (ok and bool(keys[b, 0, 0, j])) or (
                            j == i and (causal or window is not None)
                        )
                    expected[b, 0, q, j] = ok
        assert torch.equal(mask.expand(2, 1, T, S), expected)
        if padding is not None:  # every query sees at least one key: the softmax stays finite
            assert mask.expand(2, 1, T, S).any(-1).all()


def test_init_schemes_draw_what_they_promise():
    """ "xavier": zero biases, one Xavier bound over a stacked W_QKV; "fairseq": W_Q, W_K, W_V
    each Xavier with gain 1/sqrt(2), PyTorch-default biases, feed-forward weights within
    1/sqrt(fan_in) (W_2 about half of Xavier's bound). Embeddings and W_O alike in both."""
    cfg = ModelConfig.preset("tiny")
    torch.manual_seed(0)
    xavier = Transformer(cfg, init="xavier")
    torch.manual_seed(0)
    fairseq = Transformer(cfg)  # the default
    d, d_ff = cfg.d_model, cfg.d_ff
    for model in (xavier, fairseq):
        layer = model.encoder[0]
        assert torch.count_nonzero(layer.self_attn.W_O.bias) == 0
        assert layer.self_attn.W_O.weight.abs().max() <= (6 / (2 * d)) ** 0.5
        emb = model.src_embed.tokens.weight
        assert (
            abs(emb[1:].std().item() - d**-0.5) < 0.1 * d**-0.5
            and torch.count_nonzero(emb[cfg.pad_id]) == 0
        )
    x_layer, f_layer = xavier.encoder[0], fairseq.encoder[0]
    assert (
        torch.count_nonzero(x_layer.self_attn.W_QKV.bias) == 0
        and torch.count_nonzero(x_layer.feed_forward.W_2.bias) == 0
    )
    assert (
        x_layer.feed_forward.W_2.weight.abs().max() > d_ff**-0.5
    )  # Xavier's bound sqrt(6/(d+d_ff)) is wider
    assert f_layer.feed_forward.W_2.weight.abs().max() <= d_ff**-0.5
    assert 0 < f_layer.feed_forward.W_2.bias.abs().max() <= d_ff**-0.5
    assert 0 < f_layer.self_attn.W_QKV.bias.abs().max() <= d**-0.5
    for block in f_layer.self_attn.W_QKV.weight.split(d, dim=0):  # W_Q, W_K, W_V
        assert block.abs().max() <= 2**-0.5 * (6 / (2 * d)) ** 0.5
        assert block.abs().max() > 0.9 * 2**-0.5 * (6 / (2 * d)) ** 0.5  # and fills its range
    cross = fairseq.decoder[0].src_attn
    assert (
        cross.W_Q.weight.abs().max() <= 2**-0.5 * (6 / (2 * d)) ** 0.5
        and torch.count_nonzero(cross.W_KV.bias) > 0
    )
