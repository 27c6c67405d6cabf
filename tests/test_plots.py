"""Attention maps (``aiayn.analysis.plots``): one panel per head, the tokens on the outer panels."""

import torch
from _pictures import assert_picture, catch_figures

from aiayn.analysis.plots import plot_attention


def _labels(axis) -> list[str]:
    return [t.get_text() for t in axis.get_ticklabels() if t.get_visible()]


def test_each_head_shows_its_weights_and_the_outer_panels_name_the_tokens(tmp_path, monkeypatch):
    figures = catch_figures(monkeypatch)
    weights = torch.rand(8, 5, 3)
    queries, keys = [f"q{i}" for i in range(5)], ["k0", "k1", "k2"]
    plot_attention(weights, queries, keys, "layer 1", tmp_path / "map.png")
    assert_picture(tmp_path / "map.png")
    fig = figures["map.png"]
    fig.canvas.draw()  # tick labels take their text when drawn
    panels = [ax for ax in fig.axes if ax.images]
    assert [ax.get_title() for ax in panels] == [f"head {i + 1}" for i in range(8)]
    for head, ax in enumerate(panels):  # rows are queries, columns keys, as given
        assert torch.equal(torch.tensor(ax.images[0].get_array()), weights[head])
        row, col = divmod(head, 4)
        assert _labels(ax.yaxis) == (queries if col == 0 else [])
        assert _labels(ax.xaxis) == (keys if row == 1 else [])
