"""The run report's figures: matplotlib (Agg) figures as inline `<img>` tags (base64 PNG).

Each function takes plain series (see `reporting/report_data.py`) and returns HTML.
Text drawn in a figure goes through `_text`: ASCII only, so a name from the user (a
layer's name) in Chinese can neither warn about a glyph missing from matplotlib's bundled
font nor draw empty boxes, and a "$" in it is drawn, not parsed as mathtext.
"""

from __future__ import annotations

import base64
import html
import io
import math

import matplotlib

matplotlib.use("Agg")  # no display; before pyplot is imported
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

DPI = 110
WIDTH_IN = 11.5  # ~1265 px at DPI: the report's content width on a laptop screen


def _text(value: str) -> str:
    """`value` as figure text: non-ASCII characters as \\uXXXX escapes, "$" literal."""
    return value.encode("ascii", "backslashreplace").decode("ascii").replace("$", r"\$")


def _img(fig, alt: str) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _panels(n: int, cols: int, row_height: float):
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(WIDTH_IN, row_height * rows), squeeze=False,
                             layout="constrained")
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def training_curves(panels: list[tuple[str, dict[str, tuple[list[int], list[float]]]]]) -> str:
    """One panel per (title, {label: (steps, values)}), against the optimizer step."""
    fig, axes = _panels(len(panels), 3, 2.6)
    for ax, (title, series) in zip(axes, panels, strict=True):
        for label, (steps, values) in series.items():
            ax.plot(steps, values, marker="." if len(steps) < 30 else None,
                    label=_text(label))
        ax.set_title(_text(title), fontsize=10)
        ax.set_xlabel("step", fontsize=9)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        if len(series) > 1:
            ax.legend(fontsize=8)
    return _img(fig, "training curves: " + ", ".join(t for t, _ in panels))


def expert_load_heatmaps(layers: list[tuple[str, list[int], np.ndarray]]) -> str:
    """One heatmap per MoE layer: load / mean load of each expert (rows) per logging window
    (columns, labelled by the window's last step); 1.0 = balanced."""
    fig, axes = _panels(len(layers), min(2, len(layers)), 3.2)
    vmax = max(2.0, max(float(m.max()) for _, _, m in layers))
    image = None
    for ax, (name, steps, matrix) in zip(axes, layers, strict=True):
        image = ax.imshow(matrix, aspect="auto", cmap="viridis", vmin=0.0, vmax=vmax,
                          interpolation="nearest")
        ax.set_title(_text(name), fontsize=10)
        ax.set_ylabel("expert", fontsize=9)
        ax.set_xlabel("logging window (last step)", fontsize=9)
        ticks = range(0, len(steps), math.ceil(len(steps) / 12))  # at most 12 labels
        ax.set_xticks(ticks, [str(steps[i]) for i in ticks], fontsize=8)
        ax.set_yticks(range(matrix.shape[0]))
        ax.tick_params(labelsize=8)
    fig.colorbar(image, ax=axes, label="load / mean load", shrink=0.9)
    return _img(fig, "expert load per MoE layer")


def router_bias(layers: list[tuple[str, dict[str, tuple[list[int], list[float]]]]]) -> str:
    """Per MoE layer: the router bias range (min..max, shaded) and mean |b| against steps."""
    fig, axes = _panels(len(layers), min(2, len(layers)), 2.4)
    for ax, (name, series) in zip(axes, layers, strict=True):
        steps, lo = series["min"]
        _, hi = series["max"]
        ax.fill_between(steps, lo, hi, alpha=0.3, label="min..max")
        ax.plot(*series["mean_abs"], label="mean |b|")
        ax.set_title(_text(f"router bias: {name}"), fontsize=10)
        ax.set_xlabel("step", fontsize=9)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _img(fig, "router bias spread per MoE layer")


def bits_per_byte(bars: dict[str, float], threshold: float) -> str:
    """Bits per byte of the candidate (and baseline) beside the blessing threshold."""
    fig, ax = plt.subplots(figsize=(5.5, 0.5 + 0.45 * len(bars)), layout="constrained")
    names = list(bars)
    ax.barh([_text(n) for n in names], [bars[n] for n in names], color=["C0", "C7"][: len(names)])
    ax.axvline(threshold, color="C3", linestyle="--", label=f"max_bits_per_byte {threshold:g}")
    for i, n in enumerate(names):
        ax.text(bars[n], i, f" {bars[n]:.3f}", va="center", fontsize=8)
    ax.set_xlabel("bits per byte (lower is better)", fontsize=9)
    ax.set_xlim(0, max(threshold, *bars.values()) * 1.15)
    ax.invert_yaxis()
    ax.tick_params(labelsize=8)
    ax.legend(fontsize=8, loc="lower right")
    return _img(fig, "bits per byte vs. the blessing threshold")


def token_shares(sources: dict[str, tuple[float, float]]) -> str:
    """Per source (rows): its weight and the realized share of the trained tokens
    ({name: (weight, share)}, fractions), in percent."""
    fig, ax = plt.subplots(figsize=(6.5, 0.6 + 0.55 * len(sources)), layout="constrained")
    names = list(sources)
    y = np.arange(len(names))
    weights = [100 * sources[n][0] for n in names]
    shares = [100 * sources[n][1] for n in names]
    ax.barh(y - 0.2, weights, height=0.4, color="C7", label="weight")
    ax.barh(y + 0.2, shares, height=0.4, color="C0", label="realized token share")
    for i in range(len(names)):
        ax.text(shares[i], i + 0.2, f" {shares[i]:.1f}%", va="center", fontsize=8)
    ax.set_yticks(y, [_text(n) for n in names])
    ax.set_xlabel("% of the trained tokens", fontsize=9)
    ax.set_xlim(0, max(100.0, *weights, *shares) * 1.1)
    ax.invert_yaxis()
    ax.tick_params(labelsize=8)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the bars
    return _img(fig, "realized token share per source vs its weight")


def source_bits_per_byte(sources: dict[str, tuple[float | None, float]]) -> str:
    """Per source (rows): bits per byte before (the baseline; None: no bar) and after (the
    candidate) ({name: (before, after)})."""
    fig, ax = plt.subplots(figsize=(6.5, 0.6 + 0.55 * len(sources)), layout="constrained")
    names = list(sources)
    y = np.arange(len(names))
    before = [sources[n][0] for n in names]
    after = [sources[n][1] for n in names]
    if any(b is not None for b in before):
        ax.barh(y - 0.2, [b or 0.0 for b in before], height=0.4, color="C7",
                label="before (baseline)")
    ax.barh(y + 0.2, after, height=0.4, color="C0", label="after (candidate)")
    for i in range(len(names)):
        ax.text(after[i], i + 0.2, f" {after[i]:.3f}", va="center", fontsize=8)
    ax.set_yticks(y, [_text(n) for n in names])
    ax.set_xlabel("bits per byte (lower is better)", fontsize=9)
    ax.set_xlim(0, max([*after, *(b for b in before if b is not None)]) * 1.2)
    ax.invert_yaxis()
    ax.tick_params(labelsize=8)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the bars
    return _img(fig, "bits per byte per source, before and after")
