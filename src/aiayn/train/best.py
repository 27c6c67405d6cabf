"""The best validation so far: which checkpoint ``checkpoints/best`` names, and when
``patience`` stops a run (that many validations in a row without a better one)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from ..checkpoint import LOWER_IS_BETTER


@dataclass
class BestSoFar:
    metric: str  # a key of the validation record: "valid_ppl" or "valid_bleu"
    value: float | None = None
    update: int | None = None
    stale: int = 0  # validations since the best one

    def observe(self, valid: dict[str, Any], update: int) -> bool:
        """Count one validation; True when it is better than every earlier one.

        A record without the metric (no validation) counts for nothing; a non-finite value
        (a diverged run) counts as no improvement.
        """
        value = valid.get(self.metric)
        if value is None:
            return False
        if math.isfinite(value) and (self.value is None or self._better(value, self.value)):
            self.value, self.update, self.stale = float(value), update, 0
            return True
        self.stale += 1
        return False

    def _better(self, a: float, b: float) -> bool:
        return a < b if LOWER_IS_BETTER[self.metric] else a > b

    def out_of_patience(self, patience: int | None) -> bool:
        return patience is not None and self.stale >= patience

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def resumed(cls, metric: str, saved: dict[str, Any] | None) -> BestSoFar:
        """The tracker a checkpoint's meta.json saved, or a new one when it has none or
        tracked another metric (``best_metric`` changed between the runs)."""
        if not saved or saved.get("metric") != metric:
            return cls(metric)
        return cls(**saved)
