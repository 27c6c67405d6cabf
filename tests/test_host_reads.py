"""No host syncs in the step: where a training update and a beam-search step read tensor values
on the host (each read a device-to-host sync on a GPU), counted on the CPU by
``tests/host_reads.py``; and the model on a device whose values cannot be read at all.

``scripts/gpu_check.py`` counts the same steps on a GPU with ``torch.cuda.set_sync_debug_mode``.
"""

from collections import Counter

import pytest
import torch
from _cli import config
from host_reads import HostReads
from torch.utils._python_dispatch import TorchDispatchMode

from aiayn import ModelConfig, Transformer
from aiayn.decode import DecodeConfig, beam_search
from aiayn.decode.cache import decode_step, new_cache
from aiayn.decode.constraints import AllBut, OutputConstraint, constrain
from aiayn.train.trainer import Trainer


def test_the_model_reads_no_value_on_a_device():
    """On the meta device a tensor has no values: any read (the padding check of the masks, an
    ``item``) raises. The training forward and backward, encoding and two decoding steps (the
    first makes the cache) run there, so on a GPU they make no sync."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig.preset("tiny")).to("meta")
    src = torch.randint(4, 100, (3, 7), device="meta")
    tgt = torch.randint(4, 100, (3, 5), device="meta")
    model(src, tgt).sum().backward()
    model.eval()
    memory, mask = model.encode(src), model.src_mask(src)
    cache = new_cache(model, memory, mask)
    decode_step(model, tgt[:, :1], cache)
    logits = decode_step(model, tgt[:, 1:2], cache)
    assert logits.shape == (3, 100) and cache.step == 2


class _Copies(TorchDispatchMode):
    """The sizes of the tensors copied from one device to another."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func is torch.ops.aten._to_copy.default and args[0].device != out.device:
            self.sizes.append(args[0].numel())
        return out


def test_a_constraint_mask_is_made_on_the_device():
    """Only the allowed ids travel to the device, in one copy; the (rows, V) mask is made
    there (a mask made on the host was copied, and waited for, at every step)."""
    lprobs = torch.zeros(4, 1000, device="meta")
    allowed = [None, [5, 6], AllBut({3}), [7]]
    with _Copies() as copies:
        out = constrain(lprobs, allowed)
    assert out.device.type == "meta"
    # one copy: the listed rows (1, 3), then the rows and columns of 3 allowed ids and 1 not
    assert copies.sizes == [2 + 2 * 3 + 2 * 1]


def test_a_training_update_reads_the_host_at_these_sites(tiny_corpus, tmp_path):
    """One update of one micro-batch: the reads, by site. A new one fails here with its place."""
    trainer = Trainer(config(tiny_corpus, tmp_path / "run"), device="cpu")
    batches = iter(trainer.sampler)
    trainer.train_update(batches)  # the first update's lazy set-up is not the step
    with HostReads() as reads:
        trainer.train_update(batches)
    assert reads.sites == Counter(
        {
            # the host copy of the batch, before it goes to the device: no sync there
            "runtime/flops.py:real_lengths": 2,
            # the CPU's no-padding check; on a device the mask is always given (test above)
            "runtime/kernels.py:key_padding": 2,
            "model.py:forward": 1,  # states[output_mask]: padding is never projected
            # a micro-batch's targets' select, its gradient's in backward and the one copy of
            # its summed losses and token counts; the update's tolist of that host copy
            "train/trainer.py:_accumulate": 3,
            "train/trainer.py:train_update": 1,
        }
    )


def _beam_reads(steps: int, constraint: OutputConstraint | None) -> Counter:
    """Host reads of a beam search of exactly ``steps`` steps (eos is forbidden before)."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig.preset("tiny", P_drop=0.0)).eval()
    src = torch.tensor([[5, 6, 7, 8, 3], [9, 10, 11, 3, 0]])
    config = DecodeConfig(beam=4, max_len_a=0, max_len_b=steps)
    with HostReads() as reads:
        hyps = beam_search(model, src, config, min_len=steps, constraint=constraint)
    assert [len(h[0].tokens) for h in hyps] == [steps, steps]
    return reads.sites


@pytest.mark.parametrize(
    "constraint, per_step",
    [
        # finish's "does any hypothesis finish?" and the loop's "is any sentence done?"
        (None, {"decode/beam.py:finish": 1, "decode/beam.py:_leave": 1}),
        # ... and the constraint's states advance on the host: the rows and tokens kept; with
        # phrases, the banks are filled on the host (each row's best and advancing tokens, their
        # scores, and the top candidates with their beams and tokens)
        (
            OutputConstraint([12], [[20, 21]]),
            {
                "decode/beam.py:finish": 1,
                "decode/beam.py:_leave": 1,
                "decode/beam.py:expand_banked": 5,
                "decode/constraints.py:advance_states": 2,
            },
        ),
    ],
)
def test_beam_search_reads_the_host_a_fixed_number_of_times_per_step(constraint, per_step):
    """Each further step adds the same reads; the rest are once per search (the length
    limit, the constraints' start, the CPU's padding check, the n-best lists at the end) or
    once when sentences finish."""
    short, long = _beam_reads(4, constraint), _beam_reads(8, constraint)
    added = long.copy()
    added.subtract(short)
    assert {site: n / 4 for site, n in added.items() if n} == per_step
    once = {site: n for site, n in short.items() if site not in per_step}
    assert set(once) <= {
        "decode/beam.py:beam_search",  # the longest output limit: the cache's size
        "decode/constraints.py:constraint_states",
        "decode/beam.py:add",
        "decode/beam.py:nbest_lists",
        "decode/beam.py:fill_from_tail",  # how many sentences go on, when some finish
        "runtime/kernels.py:key_padding",
    }
