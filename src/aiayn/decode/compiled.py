"""Beam search with each step compiled: the decoder step and the beam bookkeeping in one graph.

The eager search (``beam``) runs some 190 small PyTorch ops a step; here one ``torch.compile``d
graph (Inductor, its C++ wrapper, weights frozen) takes the step's token and the search's state
and returns the next state: decoder step, log-probabilities, ``expand``, the finishing
candidates, ``prune``, the beam reordering of the cache. Its shapes depend on the batch
(sentences n, source length S, output limit T), never on the step t, which is a (1,) tensor:
the self-attention cache is ``model.StaticKVCache`` (T positions, those not yet written
masked), every sentence has k beams from the first step (the bos beam with log P 0, the k - 1
others -inf), and a finished sentence stays in the graph, masked, until the host loop drops
it. The only host syncs are the host loop's, between graphs: how many sentences are done.

Compiled once per model and process (``dynamic=True``: one graph for every n, S and T, and
one more where n = 1, which Dynamo specialises). The search is the paper's, the same as
``beam.beam_search``'s (the golden n-best test runs both): the same candidates, the same
float64 scores, the length penalties taken from ``gnmt_length_penalty`` on the host.
Finished hypotheses are recorded as whole (n, k) tensors per step (a mask of those chosen)
and turned into Python objects once, at the end, by ``beam._Finished``.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.ao.nn.quantized.dynamic import Linear as Int8Linear

from ..model import LayerCache, StaticKVCache, Transformer
from .beam import NEG_INF, Hypothesis, _Finished, expand, output_log_probs, prune
from .config import DecodeConfig
from .packed import PackedLinear
from .penalties import gnmt_length_penalty

# Inductor's C++ wrapper calls the kernels without Python in between; frozen weights let it
# pack them for the matmul library once, at compile time.
INDUCTOR_OPTIONS = {"cpp_wrapper": True, "freezing": True}
# Every model compiled in a process (a test session, an ensemble's members) adds graphs to the
# same code object; past Dynamo's default limit (8) it would silently run eagerly.
RECOMPILE_LIMIT = 64


@dataclass
class _State:
    """The search's state between two compiled steps, for the n sentences still decoding."""

    tok: Tensor  # (n*k, 1) each beam's last token
    scores: Tensor  # (n, k) log P of each beam's prefix
    history: Tensor  # (n*k, T) each beam's tokens so far (positions >= t-1 are stale)
    done: Tensor  # (n,) bool: the sentence can gain nothing more
    best: Tensor  # (n, nbest) float64 its nbest best finished scores (-inf while fewer)
    max_lens: Tensor  # (n,) its limit on |Y|
    lp_max: Tensor  # (n,) lp(max_len)
    memory_kv: list[tuple[Tensor, Tensor]]  # per decoder layer (n, h, S, d) keys, values
    memory_mask: Tensor  # (n, 1, 1, S) the source mask
    self_kv: list[tuple[Tensor, Tensor]]  # per decoder layer (n*k, h, T, d) keys, values
    active: Tensor  # (n,) each sentence's index in the batch

    def keep(self, sentences: Tensor, k: int) -> None:
        """Only these sentences (n',) go on; their beams' rows are sentences * k + 0..k-1."""
        rows = (sentences[:, None] * k + torch.arange(k, device=sentences.device)).view(-1)
        for name in ("tok", "history"):
            setattr(self, name, getattr(self, name).index_select(0, rows))
        for name in ("scores", "done", "best", "max_lens", "lp_max", "memory_mask", "active"):
            setattr(self, name, getattr(self, name).index_select(0, sentences))
        self.memory_kv = [
            (a.index_select(0, sentences), b.index_select(0, sentences)) for a, b in self.memory_kv
        ]
        self.self_kv = [(a.index_select(0, rows), b.index_select(0, rows)) for a, b in self.self_kv]


class SearchStep(nn.Module):
    """One beam-search step of ``model`` as a module, so that ``torch.compile`` freezes its
    weights; ``forward`` is pure tensor code (no ``.item()``, no data-dependent shapes)."""

    def __init__(
        self, model: Transformer, *, k: int, nbest: int, min_len: int, ids: tuple[int, int, int]
    ):
        super().__init__()
        self.model, self.k, self.nbest, self.min_len = model, k, nbest, min_len
        self.pad_id, self.bos_id, self.eos_id = ids

    def forward(
        self,
        t: Tensor,
        lp: Tensor,
        state: _State,
    ) -> tuple[Tensor, ...]:
        """t (1,) the output position (1-based); lp (T + 2,) float64 lp(0..T+1).

        Returns the next (tok, scores, history, done, best) and this step's finishing
        candidates (n, k): chosen (bool), score (float64), log_prob, outputs (n, k, T) and
        is_eos. The self-attention buffers in ``state.self_kv`` are written in place."""
        m, k = self.model, self.k
        n, T = state.scores.size(0), state.history.size(1)
        caches = [StaticKVCache(a, b, t - 1, m.cfg.attention_window) for a, b in state.self_kv]
        visible = caches[0].visible()  # (1, 1, 1, T)
        y = m.tgt_embed(state.tok, start=t - 1)  # (n*k, 1, d_model)
        for layer, cache, memory_kv in zip(m.decoder, caches, state.memory_kv):
            y = layer(y, None, visible, state.memory_mask, cache=LayerCache(cache, memory_kv))
        logits = m.generator(m.dec_norm(y[:, -1]))  # (n*k, V)
        lprobs = output_log_probs(logits, t, self.min_len, self.pad_id, self.bos_id, self.eos_id)
        cand = expand(state.scores, lprobs, k, self.eos_id)  # (n, 2k) each

        # beam.finish, as masks: the eos candidates among the first k (every one of the first
        # k at the length limit), of sentences not yet done.
        top, beam_of, tok, is_eos = (
            cand.top[:, :k],
            cand.beam_of[:, :k],
            cand.tok[:, :k],
            cand.is_eos[:, :k],
        )
        at_max = (state.max_lens <= t)[:, None]  # (n, 1)
        chosen = (is_eos | at_max) & (top > NEG_INF) & ~state.done[:, None]  # (n, k)
        score = top.double() / lp[t]  # (n, k)
        outputs = state.history.view(n, k, T).gather(1, beam_of[:, :, None].expand(n, k, T))
        outputs = outputs.index_copy(2, t - 1, tok[:, :, None])  # (n, k, T): prefix + token
        best = torch.cat([state.best, score.masked_fill(~chosen, NEG_INF)], dim=1)
        best = best.topk(self.nbest, dim=1).values  # (n, nbest)

        rows, tokens, scores, done = prune(
            cand,
            threshold=best[:, -1].float(),
            max_lens=state.max_lens,
            lp_max=state.lp_max,
            lp_next=lp[t + 1].float(),
            b=k,
            t=t,
        )
        rows = rows.view(-1)  # (n*k,) the beam row each new beam extends
        for a, b in state.self_kv:
            a.copy_(a.index_select(0, rows))
            b.copy_(b.index_select(0, rows))
        history = state.history.index_select(0, rows).index_copy(1, t - 1, tokens.view(-1, 1))
        return (tokens.view(-1, 1), scores, history, state.done | done, best), (
            chosen,
            score,
            top,
            outputs,
            is_eos,
        )


_COMPILED: weakref.WeakKeyDictionary[Transformer, dict[tuple, nn.Module]] = (
    weakref.WeakKeyDictionary()
)


def compiled_step(
    model: Transformer, *, k: int, nbest: int, min_len: int, ids: tuple[int, int, int]
) -> nn.Module:
    """The compiled ``SearchStep`` of ``model`` for these settings, made once per process."""
    per_model = _COMPILED.setdefault(model, {})
    key = (k, nbest, min_len, ids)
    if key not in per_model:
        torch._dynamo.config.recompile_limit = max(
            torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT
        )
        step = SearchStep(_plain(model), k=k, nbest=nbest, min_len=min_len, ids=ids).eval()
        per_model[key] = torch.compile(step, dynamic=True, fullgraph=True, options=INDUCTOR_OPTIONS)
    return per_model[key]


def _plain(model: Transformer) -> Transformer:
    """``model`` with its ``PackedLinear`` layers as ``nn.Linear`` again (the same values), the
    rest shared: Dynamo cannot trace oneDNN's opaque packed weights, and Inductor packs the
    frozen weights itself. A model without packed layers is returned as it is."""
    packed = {name: m for name, m in model.named_modules() if isinstance(m, PackedLinear)}
    if not packed:
        return model
    with torch.device("meta"):
        twin = type(model)(model.cfg)
    twin.load_state_dict(model.state_dict(), strict=False, assign=True)
    for name, buffer in model.named_buffers():
        owner, _, attr = name.rpartition(".")
        setattr(twin.get_submodule(owner), attr, buffer)
    for name, m in packed.items():
        linear = twin.get_submodule(name)
        linear.weight = nn.Parameter(m.packed.to_dense(), requires_grad=False)
        linear.bias = None if m.bias is None else nn.Parameter(m.bias, requires_grad=False)
    return twin.eval()


def supports(model: object) -> bool:
    """Whether ``compiled_beam_search`` takes this model: a ``Transformer`` with fp32 Linear
    layers, packed or not (not an ensemble, not int8)."""
    return isinstance(model, Transformer) and all(
        type(module) is not Int8Linear for module in model.modules()
    )


@torch.no_grad()
def compiled_beam_search(
    model: Transformer,
    src: Tensor,
    config: DecodeConfig,
    *,
    min_len: int,
    max_len_cap: int | None,
    pad_id: int,
    bos_id: int,
    eos_id: int,
) -> list[list[Hypothesis]]:
    """``beam.beam_search`` without a constraint, each step one compiled graph."""
    k, alpha = config.beam, config.alpha
    B, device = src.size(0), src.device
    memory, mask = model.encode(src), model.src_mask(src)  # (n, S, d_model), (n, 1, 1, S)
    max_lens = config.max_len(mask.reshape(B, -1).sum(-1), max_len_cap)  # (n,)
    T = int(max_lens.max())
    lp = [gnmt_length_penalty(i, alpha) for i in range(T + 2)]  # on the host, as beam's
    lp = torch.tensor(lp, dtype=torch.float64, device=device)  # (T + 2,)
    scores = torch.full((B, k), NEG_INF, device=device)
    scores[:, 0] = 0.0  # one beam (bos) per sentence; the others are impossible
    h, d_k, d_v = model.cfg.h, model.cfg.resolved_d_k, model.cfg.resolved_d_v
    state = _State(
        tok=torch.full((B * k, 1), bos_id, dtype=torch.long, device=device),
        scores=scores,
        history=torch.zeros(B * k, T, dtype=torch.long, device=device),
        done=torch.zeros(B, dtype=torch.bool, device=device),
        best=torch.full((B, config.nbest), NEG_INF, dtype=torch.float64, device=device),
        max_lens=max_lens,
        lp_max=gnmt_length_penalty(max_lens, alpha),
        memory_kv=[layer.src_attn.project_kv(memory) for layer in model.decoder],
        memory_mask=mask,
        self_kv=[
            (memory.new_zeros(B * k, h, T, d_k), memory.new_zeros(B * k, h, T, d_v))
            for _ in model.decoder
        ],
        active=torch.arange(B, device=device),
    )
    ids = (pad_id, bos_id, eos_id)
    step = compiled_step(model, k=k, nbest=config.nbest, min_len=min_len, ids=ids)
    finished = _Finished(B, config.nbest, device)
    for t in range(1, T + 1):
        (state.tok, state.scores, state.history, state.done, state.best), record = step(
            torch.tensor([t], device=device), lp, state
        )
        finished.records.extend(_finishing(record, state.active, t))
        n_done = int(state.done.sum())  # the host's one look at the state per step
        if n_done == state.done.numel():
            break
        if n_done * 4 >= state.done.numel():  # drop done sentences in bulk, not one at a time
            state.keep((~state.done).nonzero().squeeze(1), k)
    return finished.nbest_lists(B)


def _finishing(record: tuple[Tensor, ...], active: Tensor, t: int) -> list[tuple[Tensor, ...]]:
    """One step's chosen candidates as ``_Finished`` records (sentence, score, log_prob,
    outputs (m, t), is_eos), in the order the eager search adds them."""
    chosen, score, log_prob, outputs, is_eos = record
    i, j = chosen.nonzero(as_tuple=True)
    if i.numel() == 0:
        return []
    return [(active[i], score[i, j], log_prob[i, j], outputs[i, j, :t], is_eos[i, j])]


def compiled_models(model: Transformer) -> int:
    """How many compiled steps this process holds for ``model`` (one per beam, min_len, ids)."""
    return len(_COMPILED.get(model, {}))
