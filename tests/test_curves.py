"""curves.png reads at a glance: every point on the axes, integer rounds, labelled log
ticks, final values and the paper's value in the legend, legends off the curves."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tff_pflego.training import curves


def _run(num_rounds: int, eval_every: int, loss_range=(0.7, 0.045)):
  evals = sorted(set(range(0, num_rounds + 1, eval_every))
                 | set(range(max(0, num_rounds - 9), num_rounds + 1)))
  fraction = np.asarray(evals, float) / num_rounds
  loss = loss_range[0] * (loss_range[1] / loss_range[0]) ** fraction
  history = [dict(round=r, train_loss=l, test_accuracy_mean=0.52 + 0.45 * f,
                  test_accuracy_worst10=0.25 + 0.58 * f)
             for r, l, f in zip(evals, loss, fraction)]
  rounds = [dict(round=r, test_accuracy_sampled_pooled=0.77 + 0.2 * r / num_rounds)
            for r in range(1, num_rounds + 1)]
  summary = dict(algorithm="pflego", dataset_display_name="Fashion-MNIST",
                 personalization="high", num_clients=100, rounds=num_rounds,
                 paper_test_accuracy=0.9634,
                 final=dict(train_loss=float(loss[-1]), test_accuracy_mean=0.9681,
                            test_accuracy_worst10=0.8376,
                            test_accuracy_sampled_pooled=0.9709),
                 final_protocols=dict(window="mean of the last 3 evaluations"))
  return summary, history, rounds


@pytest.fixture
def draw():
  figures = []

  def make(*args):
    fig = curves.figure(*args)
    fig.canvas.draw()  # ticks and labels exist only once drawn
    figures.append(fig)
    return fig.axes

  yield make
  plt = curves._pyplot()
  for fig in figures:
    plt.close(fig)


@pytest.mark.parametrize("num_rounds,eval_every", [(3, 1), (50, 1), (200, 10)])
def test_every_point_is_inside_the_axes_and_rounds_are_integers(draw, num_rounds,
                                                                eval_every):
  summary, history, rounds = _run(num_rounds, eval_every)
  ax_loss, ax_acc = draw(summary, history, rounds)
  low, high = ax_acc.get_ylim()
  points = [100 * h[k] for h in history
            for k in ("test_accuracy_mean", "test_accuracy_worst10")]
  points += [100 * r["test_accuracy_sampled_pooled"] for r in rounds] + [96.34]
  assert low <= min(points) and max(points) <= high
  for ax in (ax_loss, ax_acc):
    shown = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert len(shown) >= 2 and all(float(t).is_integer() for t in shown)


def test_legends_state_final_values_and_the_papers_value_outside_the_panels(draw):
  ax_loss, ax_acc = draw(*_run(50, 1))
  labels = [t.get_text() for t in ax_acc.get_legend().get_texts()]
  assert "all clients, mean: 96.81 %" in labels
  assert "all clients, worst 10 %: 83.76 %" in labels
  assert "paper (Table 1): 96.34 %" in labels
  for ax in (ax_loss, ax_acc):  # the legend's box lies below the plotting area
    legend_box = ax.get_legend().get_window_extent()
    assert legend_box.y1 <= ax.get_window_extent().y0


@pytest.mark.parametrize("loss_range,log", [((0.7, 0.045), True), ((0.69, 0.55), False)])
def test_the_loss_axis_has_several_labelled_ticks(draw, loss_range, log):
  summary, history, rounds = _run(200, 10, loss_range)
  ax_loss, _ = draw(summary, history, rounds)
  assert (ax_loss.get_yscale() == "log") == log
  low, high = ax_loss.get_ylim()
  labelled = [t for t in ax_loss.yaxis.get_major_ticks()
              if t.label1.get_text() and low <= t.get_loc() <= high]
  assert len(labelled) >= 3
  assert all(not math.isnan(float(t.label1.get_text())) for t in labelled)


@pytest.mark.parametrize("width_in,labels", [
    (8, ["pflego", "pflego after a head refit (its τ − 1 head steps)",
         "fedrep (shortened: T=100)", "fedbabu (shortened: T=100)", "fedrecon"]),
    (15, ["pflego", "pflego after a head refit (its τ − 1 head steps)", "fedrecon"]),
    (15, [f"fedavg{i} (5 seeds)" for i in range(9)]),
])
def test_a_figure_legend_lies_inside_the_figure(width_in, labels):
  """The reproduce grid's figure legend (one per figure, below the panels), drawn
  with the figure: its box lies inside the figure, and it wraps only when one more
  entry a row would not fit."""
  plt = curves._pyplot()
  fig, ax = plt.subplots(figsize=(width_in, 8), layout="constrained")
  handles = [ax.plot([0, 1], [i, i])[0] for i in range(len(labels))]
  legend = curves.figure_legend(fig, handles, labels)
  fig.canvas.draw()
  box, page = legend.get_window_extent(), fig.bbox
  assert len(fig.legends) == 1
  assert page.x0 <= box.x0 and box.x1 <= page.x1, (box, page)
  rows = len({round(text.get_window_extent().y0) for text in legend.get_texts()})
  columns = math.ceil(len(labels) / rows)
  if columns < min(len(labels), 5):
    wider = fig.legend(handles, labels, ncol=columns + 1)
    assert wider.get_window_extent().width > page.width
  plt.close(fig)
