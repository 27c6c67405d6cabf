"""Section 5: the training recipe (Adam, warm-up schedule, label smoothing, token batches)."""

from .config import TrainConfig, load_train_config
from .schedule import noam_rate

__all__ = ["TrainConfig", "load_train_config", "noam_rate"]
