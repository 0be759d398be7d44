"""PNG plots of evaluation results (matplotlib, Agg canvas: no display, no global pyplot state)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _figure(figsize: tuple[float, float]) -> Figure:
    from matplotlib.figure import Figure  # lazy: 0.5 s to import, paid by every job otherwise

    return Figure(figsize=figsize)


def _save(fig: Figure, path: str) -> str:
    # A Figure made without pyplot prints a .png through matplotlib's Agg canvas: no display needed.
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def plot_gold_vs_cosine(scores: np.ndarray, gold: np.ndarray, path: str, title: str = "STS-B test") -> str:
    """Scatter of gold similarity (x) against model cosine (y)."""
    fig = _figure((5, 4.5))
    ax = fig.add_subplot()
    ax.scatter(gold, scores, s=6, alpha=0.4, linewidths=0)
    ax.set_xlabel("gold score")
    ax.set_ylabel("cosine similarity")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_task_bars(values: dict[str, float], path: str, title: str, ylabel: str = "Spearman x 100") -> str:
    """One bar per task, value printed on top."""
    fig = _figure((max(4.0, 0.8 * len(values) + 1), 3.5))
    ax = fig.add_subplot()
    bars = ax.bar(list(values), list(values.values()), color="tab:blue")
    ax.bar_label(bars, fmt="%.2f", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.set_ylim(0, max(100.0, max(values.values(), default=0) * 1.1))
    return _save(fig, path)


def plot_grouped_bars(rows: dict[str, dict[str, float]], path: str, title: str, ylabel: str = "Spearman x 100") -> str:
    """Tasks on the x axis, one bar per model (row) in each group."""
    tasks = list(next(iter(rows.values()))) if rows else []
    fig = _figure((max(5.0, 1.1 * len(tasks) + 1), 3.8))
    ax = fig.add_subplot()
    width = 0.8 / max(len(rows), 1)
    for i, (name, values) in enumerate(rows.items()):
        x = np.arange(len(tasks)) + (i - (len(rows) - 1) / 2) * width
        ax.bar(x, [values.get(t, np.nan) for t in tasks], width, label=name)
    ax.set_xticks(np.arange(len(tasks)), tasks)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.set_ylim(0, 100)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the bars, not over them
    return _save(fig, path)


def plot_curve(x: list[float], y: list[float], path: str, title: str, xlabel: str, ylabel: str,
               reference: dict[str, float] | None = None) -> str:
    """A learning curve, with optional horizontal reference lines (e.g. the teacher's score)."""
    fig = _figure((5.5, 3.8))
    ax = fig.add_subplot()
    ax.plot(x, y, marker=".")
    for label, value in (reference or {}).items():
        ax.axhline(value, linestyle="--", linewidth=1, color="gray")
        ax.annotate(f"{label} {value:.2f}", (x[0] if x else 0, value), fontsize=8, va="bottom")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_lines_logx(lines: dict[str, list[tuple[float, float, str]]], path: str, title: str, xlabel: str,
                    ylabel: str) -> str:
    """One line per series of (x, y, label) points over a log x axis, each point labelled (a scaling
    plot: score against parameters or FLOPs, one line per architecture)."""
    fig = _figure((6, 4))
    ax = fig.add_subplot()
    for name, points in lines.items():
        points = sorted(points)
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
        for x, y, label in points:
            ax.annotate(label, (x, y), fontsize=7, textcoords="offset points", xytext=(3, 3))
    ax.set_xscale("log")
    ax.tick_params(axis="x", which="minor", labelbottom=False)  # labels on decades only: minor labels overlap
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return _save(fig, path)
