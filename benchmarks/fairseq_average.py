"""Average fairseq checkpoints, in the fairseq venv, for ``demo_vs_fairseq.py``.

fairseq's own averager is ``scripts/average_checkpoints.py`` of its repository, which neither the
fairseq-fixed nor the fairseq 0.12.2 package ships (wheel or sdist), so this does the same job
with fairseq's own loader and saver: the mean of the ``model`` tensors (accumulated in float32,
as ``aiayn average`` does), everything else (the config fairseq-generate needs) from the
newest checkpoint.

    python benchmarks/fairseq_average.py OUT.pt IN1.pt IN2.pt IN3.pt

fairseq's checkpoints pickle their config, so torch's default weights-only loading refuses
them; the caller sets TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 for fairseq's processes only. They are
the checkpoints this benchmark's own fairseq-train wrote a moment before.
"""

from __future__ import annotations

import sys


def main() -> None:
    import torch
    from fairseq.checkpoint_utils import load_checkpoint_to_cpu, torch_persistent_save

    out, inputs = sys.argv[1], sys.argv[2:]
    if not inputs:
        raise SystemExit("fairseq_average.py: no checkpoints to average")
    states = [load_checkpoint_to_cpu(path) for path in inputs]
    names = set(states[0]["model"])
    for path, state in zip(inputs, states):
        if set(state["model"]) != names:
            raise SystemExit(f"fairseq_average.py: {path} holds different tensors than {inputs[0]}")
    averaged = {}
    for name in names:
        last = states[-1]["model"][name]
        if last.is_floating_point():
            total = torch.zeros_like(last, dtype=torch.float32)
            for state in states:
                total += state["model"][name].float()
            averaged[name] = (total / len(states)).to(last.dtype)
        else:
            averaged[name] = last.clone()
    state = states[-1]
    state["model"] = averaged
    torch_persistent_save(state, out)  # fairseq's saver writes OUT.tmp and renames it


if __name__ == "__main__":
    main()
