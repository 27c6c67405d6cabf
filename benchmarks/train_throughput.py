"""Training throughput of aiayn against three peers, side by side, on the same batches (CPU, fp32;
bf16 autocast and the compiled step as variants of ours).

Cost: 5-30 minutes on a 2-core CPU for both configs and all peers (defaults below), depending on
how busy the machine is. Expected on a quiet 2-core machine (best repetitions, small config):
ours ~4.7-5k tokens/s, torch.nn ~4.3k, ~46% MFU against a ~235 GFLOP/s matmul peak. On a busy
one every peer slows down 10x in bursts (oversubscribed OpenMP threads); ours with fused Adam
and aiayn.train.loss degrades least.

    # project venv: peers that are not installed are skipped with a message
    PYTHONPATH=src .venv/bin/python benchmarks/train_throughput.py
    # all peers (a separate venv holding transformers and fairseq-fixed)
    PYTHONPATH=src ../benchvenv/bin/python benchmarks/train_throughput.py
    # bf16 against fp32 on a CPU with native bf16: each row and its bf16 autocast twin (ours
    # with the attention the trainer takes), bf16 / fp32 per system; the demo recipe's own
    # bf16 figure (A-B-B-A, perplexity too) is `aiayn measure train_bf16`
    PYTHONPATH=src .venv/bin/python benchmarks/train_throughput.py --configs small --bf16 \
        --peers ours+lsloss+fusedadam,torch.nn+fusedadam,hf-marian+fusedadam
    # ours as trained, compiled (compile=true) and not: compile time, graphs, speed-up and when
    # it pays back (compile=auto's own figure: `aiayn measure compile`)
    PYTHONPATH=src .venv/bin/python benchmarks/train_throughput.py --configs small --reps 3 \
        --steps 3 --peers ours+lsloss+fusedadam,ours+lsloss+fusedadam+compile
    # the layers compiled for one shape (what bucketing batches into a few shapes would buy)
    PYTHONPATH=src .venv/bin/python benchmarks/train_throughput.py --configs small --reps 6 \
        --min-len 30 --peers ours+lsloss+fusedadam,ours+lsloss+fusedadam+compilestatic

``--record DIR`` writes each config's figures as a record (``aiayn.records``, topic training).

One training step, identical for every peer: forward, label-smoothed cross-entropy (eps_ls 0.1,
padding ignored, summed and divided by the number of target tokens), backward, Adam (0.9, 0.98,
1e-9). Every peer is configured as the paper: post-LN, sinusoidal positions, one embedding matrix
shared by source, target and pre-softmax projection, embeddings scaled by sqrt(d_model), dropout
0.1 on residuals and embeddings, no attention or ReLU dropout, no final LayerNorm, no LayerNorm on
the embeddings. The vocabulary is the same for every peer within a config (--vocab).

Timing: every peer's model lives in one process; each repetition runs --steps steps of every peer
in turn (interleaved, so that noise from other jobs on the machine hits all peers alike, the
starting peer rotating); the table gives the median and the best repetition. tokens/s counts
non-pad source + target tokens.

MFU is aiayn.runtime.flops's, the yardstick of the trainer's summary too: model FLOPs of each step
counted on the non-pad lengths (forward matmuls x 3, full-square attention), over the fp32
matmul peak measured in the same run on the same threads (aiayn.runtime.flops.measure_matmul_peak:
2048 x 2048 matrices, the best window; here the best of the probes taken between configs).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.records import make_record, package_version, write_record
from aiayn.runtime import figures as measured
from aiayn.runtime import hardware
from aiayn.runtime.flops import measure_matmul_peak, mfu, real_lengths, training_flops

PAD, BOS, EOS = 1, 0, 2  # fairseq's Dictionary layout; every peer is told pad = 1
FIRST_WORD = 4  # ids below are specials in fairseq's Dictionary


@dataclass(frozen=True)
class Shape:
    name: str
    d_model: int
    N: int
    h: int
    d_ff: int
    vocab: int


SHAPES = {
    "tiny": Shape("tiny", 32, 1, 2, 64, 300),  # a check of the commands, in seconds
    "small": Shape("small", 256, 3, 4, 1024, 8000),
    "base": Shape("base", 512, 6, 8, 2048, 37000),
}


# --- batches ------------------------------------------------------------------------------


@dataclass
class Batch:
    src: Tensor  # (B, S) padded with PAD
    tgt_in: Tensor  # (B, T) BOS y
    tgt_out: Tensor  # (B, T) y EOS
    src_lengths: Tensor  # (B,)
    n_src: int
    n_tgt: int

    @property
    def tokens(self) -> int:
        return self.n_src + self.n_tgt


def make_batches(
    n: int, batch: int, max_len: int, min_len: int, vocab: int, seed: int
) -> list[Batch]:
    """n random batches: each sentence has a length in [min_len, max_len] (incl. BOS/EOS)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        s_len = torch.randint(min_len, max_len + 1, (batch,), generator=g)
        t_len = torch.randint(min_len, max_len + 1, (batch,), generator=g)
        S, T = int(s_len.max()), int(t_len.max())
        src = torch.full((batch, S), PAD)
        tgt = torch.full((batch, T + 1), PAD)
        for i in range(batch):
            s, t = int(s_len[i]), int(t_len[i])
            src[i, :s] = torch.randint(FIRST_WORD, vocab, (s,), generator=g)
            src[i, s - 1] = EOS
            tgt[i, 0] = BOS
            tgt[i, 1 : t + 1] = torch.randint(FIRST_WORD, vocab, (t,), generator=g)
            tgt[i, t] = EOS
        tgt_in, tgt_out = tgt[:, :-1].clone(), tgt[:, 1:].clone()
        tgt_in[tgt_in == EOS] = PAD  # the EOS position is never an input
        out.append(
            Batch(src, tgt_in, tgt_out, s_len, int(s_len.sum()), int((tgt_out != PAD).sum()))
        )
    return out


# --- peers: each returns (model, step_loss(batch) -> loss normalised by target tokens) -------


def sinusoidal(max_len: int, d: int) -> Tensor:
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]
    div = torch.pow(10000.0, torch.arange(0, d, 2, dtype=torch.float64) / d)
    pe = torch.zeros(max_len, d, dtype=torch.float64)
    pe[:, 0::2], pe[:, 1::2] = torch.sin(pos / div), torch.cos(pos / div)
    return pe.float()


def ls_cross_entropy(logits: Tensor, target: Tensor, eps: float = 0.1) -> Tensor:
    """Label-smoothed cross-entropy summed over non-pad targets (PyTorch's formulation)."""
    return F.cross_entropy(
        logits.reshape(-1, logits.size(-1)),
        target.reshape(-1),
        ignore_index=PAD,
        label_smoothing=eps,
        reduction="sum",
    )


def model_config(sh: Shape) -> ModelConfig:
    """The shape as aiayn's config: what ours trains, and what every peer's FLOPs are counted on."""
    return ModelConfig(
        N_enc=sh.N,
        N_dec=sh.N,
        d_model=sh.d_model,
        d_ff=sh.d_ff,
        h=sh.h,
        vocab_size=sh.vocab,
        pad_id=PAD,
        max_len=256,
        P_drop=0.1,
    )


def build_ours(sh: Shape, variant: str = "") -> tuple[nn.Module, Callable[[Batch], Tensor]]:
    import aiayn
    from aiayn.model import as_given
    from aiayn.runtime.kernels import UniformDropout, bf16_matmul_attention, use_fast_paths
    from aiayn.train.mixed import WeightCopies
    from aiayn.train.trainer import compile_layers

    options = set(variant.split("+"))
    model = use_fast_paths(aiayn.Transformer(model_config(sh)))
    if "uniformdropout" in options:
        for module in model.modules():
            if isinstance(module, UniformDropout):
                module.forward = partial(_uniform_dropout, module)
    if "sdpabf16" in options:  # the model's own attention: SDPA in the activations' dtype
        sdpa = F.scaled_dot_product_attention
        model.use_kernels(replace(model.kernels, attention_cast=as_given, attention=sdpa))
    fwd: Callable = model
    if "compile" in options:  # what the trainer's compile=true does
        compile_layers(model)
    if "compilestatic" in options:  # each layer with static shapes: a graph per batch shape
        for layer in [*model.encoder, *model.decoder]:
            layer.compile(dynamic=False)
    if "compilemodel" in options:  # the whole model (graph breaks at its data-dependent masks)
        fwd = torch.compile(model, dynamic=True)
    loss_fn = _ours_loss(variant)
    # bf16: CPU autocast as the trainer's amp=bf16 (emulated, slower, on a CPU without avx512_bf16)
    dtype = torch.bfloat16 if "bf16" in options else None
    # the trainer's bf16 copies of the weights, one cast per update; nocopies: a cast per use
    copies = WeightCopies(fwd, None if "nocopies" in options else dtype)

    def step_loss(b: Batch) -> Tensor:
        mask = b.tgt_out != PAD
        copies.refresh()  # one step = one update here
        with (
            _sdpa_backend(variant),
            torch.autocast("cpu", dtype, enabled=dtype is not None),
            bf16_matmul_attention("mmattn" in options),
        ):
            logits = copies(b.src, b.tgt_in, output_mask=mask)  # (n_tgt, vocab): no pad rows
        if "castloss" in options:  # logits cast to fp32 before the loss, as before issue 40
            logits = logits.float()
        return loss_fn(logits, b.tgt_out[mask]) / b.n_tgt

    return model, step_loss


def _uniform_dropout(module: nn.Dropout, x: Tensor) -> Tensor:
    """The CPU dropout before model.keep_mask, for comparison: a uniform_ draw per element,
    compared and scaled in the input's dtype."""
    if not module.training or module.p == 0.0:
        return x
    keep = 1.0 - module.p
    noise = torch.empty_like(x).uniform_()
    return x * (noise < keep).to(x.dtype).mul_(1.0 / keep)


def _sdpa_backend(variant: str):
    """'math' in the variant: SDPA's unfused math backend instead of the CPU flash kernel."""
    from contextlib import nullcontext

    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.MATH]) if "math" in variant else nullcontext()


def _ours_loss(variant: str) -> Callable[[Tensor, Tensor], Tensor]:
    """The loss of logits in the model's dtype: the trainer's takes bf16 as it is."""
    if "lsloss" in variant:
        from aiayn.train.loss import label_smoothed_nll

        return lambda logits, target: label_smoothed_nll(logits, target, 0.1, PAD)[0]
    return lambda logits, target: F.cross_entropy(
        logits.float(), target, label_smoothing=0.1, reduction="sum"
    )


class TorchNNSeq2Seq(nn.Module):
    """torch.nn.Transformer inside the paper's embedding, positions and tied output projection."""

    def __init__(self, sh: Shape) -> None:
        super().__init__()
        d, p = sh.d_model, 0.1
        self.embed = nn.Embedding(sh.vocab, d, padding_idx=PAD)
        nn.init.normal_(self.embed.weight, std=d**-0.5)
        self.register_buffer("pe", sinusoidal(256, d), persistent=False)
        self.scale, self.dropout = math.sqrt(d), nn.Dropout(p)
        enc = nn.TransformerEncoderLayer(d, sh.h, sh.d_ff, p, batch_first=True, norm_first=False)
        dec = nn.TransformerDecoderLayer(d, sh.h, sh.d_ff, p, batch_first=True, norm_first=False)
        # norm=None: the paper's post-LN stacks have no final LayerNorm (nn.Transformer adds one).
        self.transformer = nn.Transformer(
            d,
            sh.h,
            custom_encoder=nn.TransformerEncoder(enc, sh.N, norm=None, enable_nested_tensor=False),
            custom_decoder=nn.TransformerDecoder(dec, sh.N, norm=None),
            batch_first=True,
        )
        for layer in [*self.transformer.encoder.layers, *self.transformer.decoder.layers]:
            layer.dropout = nn.Identity()  # no ReLU dropout (torch.nn ties it to `dropout`)
            for attn in (getattr(layer, "self_attn", None), getattr(layer, "multihead_attn", None)):
                if attn is not None:
                    attn.dropout = 0.0  # no attention dropout

    def embed_pos(self, x: Tensor) -> Tensor:
        return self.dropout(self.embed(x) * self.scale + self.pe[: x.size(1)])

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        T = tgt_in.size(1)
        causal = nn.Transformer.generate_square_subsequent_mask(T, dtype=torch.bool)
        src_pad = src == PAD
        h = self.transformer(
            self.embed_pos(src),
            self.embed_pos(tgt_in),
            tgt_mask=causal,
            tgt_is_causal=True,
            src_key_padding_mask=src_pad,
            memory_key_padding_mask=src_pad,
            tgt_key_padding_mask=tgt_in == PAD,
        )
        return h @ self.embed.weight.t()  # tied pre-softmax projection


def _peer_autocast(variant: str) -> torch.autocast:
    """A peer's forward in CPU bf16 autocast when its variant says bf16 (its logits fp32)."""
    return torch.autocast("cpu", torch.bfloat16, enabled="bf16" in variant.split("+"))


def build_torchnn(sh: Shape, variant: str = "") -> tuple[nn.Module, Callable[[Batch], Tensor]]:
    model = TorchNNSeq2Seq(sh)

    def step_loss(b: Batch) -> Tensor:
        with _peer_autocast(variant):
            logits = model(b.src, b.tgt_in)
        return ls_cross_entropy(logits.float(), b.tgt_out) / b.n_tgt

    return model, step_loss


def build_hf(sh: Shape, variant: str = "") -> tuple[nn.Module, Callable[[Batch], Tensor]]:
    from transformers import MarianConfig, MarianMTModel

    cfg = MarianConfig(
        vocab_size=sh.vocab,
        decoder_vocab_size=sh.vocab,
        d_model=sh.d_model,
        encoder_layers=sh.N,
        decoder_layers=sh.N,
        encoder_attention_heads=sh.h,
        decoder_attention_heads=sh.h,
        encoder_ffn_dim=sh.d_ff,
        decoder_ffn_dim=sh.d_ff,
        activation_function="relu",
        dropout=0.1,
        attention_dropout=0.0,
        activation_dropout=0.0,
        max_position_embeddings=256,
        scale_embedding=True,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
        normalize_before=False,
        pad_token_id=PAD,
        eos_token_id=EOS,
        decoder_start_token_id=BOS,
        use_cache=False,
    )
    model = MarianMTModel(cfg)

    def step_loss(b: Batch) -> Tensor:
        with _peer_autocast(variant):
            logits = model(
                input_ids=b.src,
                attention_mask=b.src != PAD,
                decoder_input_ids=b.tgt_in,
                decoder_attention_mask=b.tgt_in != PAD,
                use_cache=False,
            ).logits
        return ls_cross_entropy(logits.float(), b.tgt_out) / b.n_tgt

    return model, step_loss


def build_fairseq(sh: Shape, variant: str = "") -> tuple[nn.Module, Callable[[Batch], Tensor]]:
    from argparse import Namespace

    from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss
    from fairseq.data import Dictionary
    from fairseq.models.transformer import TransformerModel, base_architecture

    vocab = Dictionary()  # bos 0, pad 1, eos 2, unk 3: the layout the batches use
    for i in range(sh.vocab - len(vocab)):
        vocab.add_symbol(f"w{i}")
    assert len(vocab) == sh.vocab and vocab.pad() == PAD and vocab.eos() == EOS

    class Task:  # build_model only reads the two dictionaries
        source_dictionary = target_dictionary = vocab

    args = Namespace(
        encoder_embed_dim=sh.d_model,
        encoder_ffn_embed_dim=sh.d_ff,
        encoder_layers=sh.N,
        encoder_attention_heads=sh.h,
        decoder_embed_dim=sh.d_model,
        decoder_ffn_embed_dim=sh.d_ff,
        decoder_layers=sh.N,
        decoder_attention_heads=sh.h,
        share_all_embeddings=True,
        encoder_normalize_before=False,
        decoder_normalize_before=False,
        layernorm_embedding=False,
        no_scale_embedding=False,
        encoder_learned_pos=False,
        decoder_learned_pos=False,
        dropout=0.1,
        attention_dropout=0.0,
        activation_dropout=0.0,
        activation_fn="relu",
        max_source_positions=256,
        max_target_positions=256,
    )
    base_architecture(args)
    model = TransformerModel.build_model(args, Task())

    def step_loss(b: Batch) -> Tensor:
        net_output = model(b.src, b.src_lengths, b.tgt_in)
        lprobs = model.get_normalized_probs(net_output, log_probs=True)
        loss, _ = label_smoothed_nll_loss(
            lprobs.view(-1, lprobs.size(-1)), b.tgt_out.view(-1), 0.1, ignore_index=PAD, reduce=True
        )
        return loss / b.n_tgt

    return model, step_loss


PEERS: dict[str, Callable] = {
    "ours": build_ours,
    "torch.nn": build_torchnn,
    "hf-marian": build_hf,
    "fairseq": build_fairseq,
}


# --- measurement -----------------------------------------------------------------------------


class Runner:
    def __init__(self, name: str, sh: Shape, adam: str, variant: str) -> None:
        builder = PEERS[name.split("+")[0]]
        self.name = name
        self.model, self.step_loss = builder(sh, variant)
        self.model.train()
        self.graphs = 0  # graphs its warm-up compiled
        adam = "fused" if "fusedadam" in variant else "foreach" if "foreach" in variant else adam
        kw = {"foreach": adam == "foreach", "fused": adam == "fused"} if adam != "default" else {}
        self.opt = torch.optim.Adam(
            self.model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, **kw
        )

    def step(self, b: Batch) -> float:
        loss = self.step_loss(b)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    def run(self, batches: list[Batch]) -> tuple[int, float]:
        t0 = time.perf_counter()
        for b in batches:
            self.step(b)
        return sum(b.tokens for b in batches), time.perf_counter() - t0


def step_flops(sh: Shape, b: Batch) -> float:
    """Training FLOPs of one step, as aiayn's trainer counts them."""
    return training_flops(model_config(sh), real_lengths(b.src, PAD), real_lengths(b.tgt_out, PAD))


def bench_shape(sh: Shape, peers: list[str], args: argparse.Namespace) -> dict[str, list[float]]:
    batches = make_batches(
        args.batches, args.batch, args.max_len, args.min_len, sh.vocab, args.seed
    )
    runners, warmups = [], {}
    for name in peers:
        variant = name.partition("+")[2]
        try:
            torch.manual_seed(0)
            r = Runner(name, sh, args.adam, variant)
            graphs = _graphs()
            # warm-up one step at a time: compilation (for +compile) lands in the first ones
            warmup_s = [r.run([b])[1] for b in batches[: args.warmup]]
            r.graphs = _graphs() - graphs
            warmups[name] = warmup_s
            print(
                f"  {name:<30} warm-up steps "
                + ", ".join(f"{t:.1f}" for t in warmup_s)
                + f" s; {r.graphs} graphs compiled",
                flush=True,
            )
            runners.append(r)
        except ImportError as e:
            print(f"  {name:<30} skipped: {e}", flush=True)
    rates: dict[str, list[float]] = {r.name: [] for r in runners}
    warm_graphs = _graphs()
    for rep in range(args.reps):
        chunk = [batches[(rep * args.steps + i) % len(batches)] for i in range(args.steps)]
        order = (
            runners[rep % len(runners) :] + runners[: rep % len(runners)]
        )  # rotate who goes first
        for r in order:
            tokens, seconds = r.run(chunk)
            rates[r.name].append(tokens / seconds)
        print(
            f"  rep {rep + 1}/{args.reps}: "
            + ", ".join(f"{n} {v[-1]:.0f}" for n, v in rates.items()),
            flush=True,
        )
    if any(r.graphs for r in runners):  # compiled while timed: recompilations on new shapes
        print(f"  graphs compiled during the timed steps: {_graphs() - warm_graphs}")
    rates["_flops_per_token"] = [
        sum(step_flops(sh, b) for b in batches) / sum(b.tokens for b in batches)
    ]
    compile_report(warmups, rates, batches)
    return rates


def _graphs() -> int:
    """Graphs torch.compile has compiled in this process so far (every recompilation counts)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def eager_twin(row: str) -> str:
    """The row without its compile options (compile, compilestatic, compilemodel)."""
    return "+".join(o for o in row.split("+") if not o.startswith("compile"))


def compile_report(
    warmups: dict[str, list[float]], rates: dict[str, list[float]], batches: list[Batch]
) -> None:
    """Each compiled row against its eager twin: compile time (its warm-up time over the time the
    same steps take at its own best rate), speed-up (best rates), and the training seconds after
    which the compiled run has made as many updates as the eager one, the issue's rule being
    45 s (5% of a 15-minute demo): C / (1 - eager rate / compiled rate)."""
    tokens_per_step = sum(b.tokens for b in batches) / len(batches)
    for name, warm in warmups.items():
        eager = eager_twin(name)
        if eager == name or eager not in rates or not rates.get(name):
            continue
        fast, slow = max(rates[name]), max(rates[eager])
        compile_s = sum(warm) - len(warm) * tokens_per_step / fast
        gain = fast / slow
        payback = f"{compile_s / (1 - 1 / gain):.0f} s" if gain > 1 else "never"
        print(
            f"  {name}: compile {compile_s:.0f} s, {gain:.2f}x {eager} (best), "
            f"pays back after {payback} of training"
        )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", default="small,base", help="comma list of: " + ", ".join(SHAPES))
    p.add_argument(
        "--peers",
        default="ours,torch.nn,hf-marian,fairseq",
        help="comma list; torch.nn and hf-marian take +bf16 (CPU autocast) and +fusedadam; "
        "variants of ours join options with '+': compile (the trainer's "
        "compile=true: each layer, dynamic), compilestatic (each layer, static shapes: give "
        "--min-len = --max-len, one shape), compilemodel (torch.compile of the whole model, "
        "dynamic), bf16 (CPU autocast with the weights' bf16 copies, as amp=bf16), nocopies (bf16 "
        "autocast casting each weight at its use instead), uniformdropout (dropout's mask from a "
        "uniform_ draw per element, as before model.keep_mask), lsloss (aiayn.train.loss), castloss "
        "(bf16 logits cast to fp32 before the loss, its own node), fusedadam / "
        "foreach (Adam for this row only), math (SDPA math backend), mmattn (with bf16: attention as "
        "bf16 matmuls and softmax, model.matmul_attention), sdpabf16 (with bf16: SDPA in bf16, "
        "the projections not cast to fp32 for it)",
    )
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--max-len", type=int, default=30, help="longest sentence, BOS/EOS included")
    p.add_argument("--min-len", type=int, default=20, help="shortest (= max-len: no padding)")
    p.add_argument("--batches", type=int, default=16, help="distinct batches, cycled")
    p.add_argument("--steps", type=int, default=4, help="steps per peer per repetition")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument(
        "--adam",
        default="default",
        choices=["default", "foreach", "fused"],
        help="Adam implementation, the same for every peer",
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument(
        "--bf16", action="store_true", help="each row also in bf16 autocast: bf16 / fp32 per row"
    )
    p.add_argument("--record", help="write each config's figures as a record into this folder")
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    peers = args.peers.split(",")
    twins = bf16_twins(peers) if args.bf16 else {}
    peers += list(twins.values())
    print(
        f"torch {torch.__version__}, {args.threads} threads, batch {args.batch} x "
        f"lengths {args.min_len}..{args.max_len}, Adam {args.adam}, "
        f"{args.reps} reps x {args.steps} steps, interleaved",
        flush=True,
    )
    results = {}
    peaks = [measure_matmul_peak()]
    for name in args.configs.split(","):
        sh = SHAPES[name]
        print(
            f"{name}: d_model {sh.d_model}, N {sh.N}+{sh.N}, h {sh.h}, d_ff {sh.d_ff}, "
            f"vocab {sh.vocab} (all peers)",
            flush=True,
        )
        results[name] = bench_shape(sh, peers, args)
        peaks.append(measure_matmul_peak())
    peak = max(peaks)  # the machine is shared: the best probe is the closest to the peak
    print(
        f"\nfp32 matmul peak (2048^3, {args.threads} threads, best of {len(peaks)} probes): "
        f"{peak / 1e9:.1f} GFLOP/s"
    )
    report(results, peak)
    if twins:
        report_bf16(results, twins)
    if args.record:
        for name, rates in results.items():
            path = write_record(config_record(name, rates, twins, args), args.record)
            print(f"wrote {path}")


def bf16_twins(rows: list[str]) -> dict[str, str]:
    """Each row's bf16 autocast twin; ours takes the attention the trainer would take on this
    CPU (bf16 matmuls where its class measured them to pay). Refused without native bf16,
    where PyTorch emulates bf16 through fp32 and every twin would be slower."""
    support = hardware.bf16_support(torch.device("cpu"))
    if not support.native:
        sys.exit(f"train_throughput --bf16: {support.reason}: nothing to measure")
    mmattn = measured.train_bf16_matmul_attention(support.chip).on
    return {
        row: row + "+bf16" + ("+mmattn" if mmattn and row.startswith("ours") else "")
        for row in rows
        if "bf16" not in row.split("+")
    }


def report_bf16(results: dict[str, dict[str, list[float]]], twins: dict[str, str]) -> None:
    """bf16 over fp32 for each row and its twin, best repetitions."""
    print(
        "\n| config | row | fp32 tokens/s (best) | bf16 | bf16 / fp32 |\n|---|---|---:|---:|---:|"
    )
    for cfg, rates in results.items():
        for row, twin in twins.items():
            if row in rates and twin in rates:
                fp32, bf16 = max(rates[row]), max(rates[twin])
                print(f"| {cfg} | {row} | {fp32:,.0f} | {bf16:,.0f} | {bf16 / fp32:.2f}x |")


PEER_PACKAGES = {"hf-marian": "transformers", "fairseq": "fairseq-fixed"}


def config_record(name: str, rates: dict[str, list[float]], twins: dict[str, str], args):
    """One config's best tokens/s per row (and bf16 / fp32 per twin) as a record."""
    sh, best = SHAPES[name], {row: max(v) for row, v in rates.items()}
    ours = [r for r in best if r.startswith("ours") and r not in twins.values()]
    others = [r for r in best if not r.startswith("ours") and r not in twins.values()]
    figures: dict[str, float | int | str] = {}
    if twins:
        figures |= {f"{r} bf16 / fp32": f"{best[t] / best[r]:.2f}x" for r, t in twins.items()}
    if ours and others:
        figures["ours / fastest peer"] = f"{best[ours[0]] / max(best[r] for r in others):.2f}x"
    for row in ours:  # a compiled row against its eager twin
        eager = eager_twin(row)
        if eager != row and eager in best:
            figures[f"{row} / {eager}"] = f"{best[row] / best[eager]:.2f}x"
    figures |= {f"{row} tokens/s": round(rate) for row, rate in best.items()}
    shape = f"d{sh.d_model} {sh.N}+{sh.N}, {'bf16 against fp32' if twins else 'fp32'}"
    peers = {row.split("+")[0] for row in others}
    against = " against the peers" if others else ""
    if any(" / " in key and "compile" in key for key in figures):
        against += f", compiled against eager, lengths {args.min_len}-{args.max_len}"
    return make_record(
        topic="training",
        what=f"training step, {shape}{against}",
        figures=figures,
        command="benchmarks/train_throughput.py " + " ".join(sys.argv[1:]),
        threads=args.threads,
        peers={p: package_version(PEER_PACKAGES.get(p, "torch")) for p in peers},
        notes=f"best of {args.reps} interleaved repetitions of {args.steps} steps",
    )


def report(results: dict[str, dict[str, list[float]]], peak: float) -> None:
    """Median and best repetition per row; ratios of ours (plain) to each peer on both.

    On a shared machine the slowdowns come in bursts (oversubscribed OpenMP threads can make a
    step 10x slower); the best of many short interleaved repetitions is then the robust estimate
    of each peer's own speed, the median shows how much the bursts hit it. Rows of variants of
    ours give their ratio to the fastest peer instead.
    """
    print(
        "\n| config | peer | tokens/s median | best | ratio (median) | ratio (best) | MFU (best) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for cfg, rates in results.items():
        flops_per_token = rates.pop("_flops_per_token")[0]
        med = {n: statistics.median(v) for n, v in rates.items()}
        best = {n: max(v) for n, v in rates.items()}
        peers = [n for n in rates if not n.startswith("ours")]
        for n in rates:
            if n.startswith("ours") and peers:
                r_med = f"{med[n] / max(med[p] for p in peers):.2f}x fastest"
                r_best = f"{best[n] / max(best[p] for p in peers):.2f}x fastest"
            elif "ours" in med and not n.startswith("ours"):
                r_med, r_best = (
                    f"ours {med['ours'] / med[n]:.2f}x",
                    f"ours {best['ours'] / best[n]:.2f}x",
                )
            else:
                r_med = r_best = "-"
            print(
                f"| {cfg} | {n} | {med[n]:,.0f} | {best[n]:,.0f} | {r_med} | {r_best} | "
                f"{100 * mfu(flops_per_token, 1 / best[n], peak):.1f}% |"
            )  # one token's FLOPs, its time
    sys.stdout.flush()


if __name__ == "__main__":
    main()
