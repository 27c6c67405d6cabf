"""Section 5.3: lrate = d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)."""

from __future__ import annotations


def noam_rate(step: int, d_model: int, warmup: int, scale: float = 1.0) -> float:
    """Learning rate of update ``step`` (1-based): linear warm-up, then inverse square root.

    ``scale`` multiplies the paper's formula (1.0 = the paper); small models on small data
    often train faster with a larger peak, which is a deviation and is labelled as one.
    """
    step = max(step, 1)
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
