"""Helpers for the tests of what the program draws: a written PNG decodes to a picture (not a
blank canvas), and the figures behind it, caught on their way to the file, hold the numbers."""

from __future__ import annotations

from pathlib import Path

import matplotlib.image
import numpy as np


def assert_picture(path: Path) -> None:
    """``path`` is a PNG that decodes to a picture of more than a few colours."""
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path
    pixels = matplotlib.image.imread(path)
    assert pixels.ndim == 3 and min(pixels.shape[:2]) >= 100, (path, pixels.shape)
    # each pixel's channels packed into one integer: np.unique over rows sorts them as tuples,
    # seconds for a map of a few million pixels
    channels = np.round(pixels.reshape(-1, pixels.shape[-1]) * 255).astype(np.uint64)
    packed = sum(channels[:, i] << np.uint64(8 * i) for i in range(channels.shape[1]))
    assert len(np.unique(packed)) > 10, path


def catch_figures(monkeypatch) -> dict[str, object]:
    """{file name: the matplotlib figure saved there} for every figure that
    ``aiayn.analysis.plots.save_figure`` writes from now on (still written)."""
    from aiayn.analysis import plots

    figures, save = {}, plots.save_figure

    def keep(fig, path):
        figures[Path(path).name] = fig
        return save(fig, path)

    monkeypatch.setattr(plots, "save_figure", keep)
    return figures
