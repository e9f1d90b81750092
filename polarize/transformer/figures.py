"""Figures of a transformer-lab result directory (PNG, labelled axes)."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

_COLORS = {True: "tab:blue", False: "tab:orange"}


def _bars(ax, summary: dict, field: str, ylabel: str, note=None) -> None:
    norms = list(summary["by_norm"])
    values = [summary["by_norm"][n][field] for n in norms]
    heights = [np.nan if v is None else v for v in values]
    colors = [_COLORS[summary["by_norm"][n]["normalized"]] for n in norms]
    ax.bar(range(len(norms)), heights, color=colors)
    for i, n in enumerate(norms):
        if note is not None:
            ax.annotate(
                note(summary["by_norm"][n]),
                (i, 0),
                textcoords="offset points",
                xytext=(0, 3),
                ha="center",
                fontsize=7,
            )
    ax.set_xticks(range(len(norms)), norms, rotation=30, ha="right")
    ax.set_xlabel("attention normalization (blue: normalized, orange: not)")
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, 1.05)


def _scatter(ax, summary: dict, units: list, field: str, ylabel: str) -> None:
    norms = list(summary["by_norm"])
    for i, n in enumerate(norms):
        ys = np.concatenate([np.ravel(u[field]) for u in units if u["norm"] == n] or [[]])
        color = _COLORS[summary["by_norm"][n]["normalized"]]
        ax.plot(np.full(len(ys), i, float), ys, "o", alpha=0.6, color=color)
    ax.set_xticks(range(len(norms)), norms, rotation=30, ha="right")
    ax.set_xlabel("attention normalization")
    ax.set_ylabel(ylabel)


def _maps(config: dict, units: list, path: Path) -> None:
    examples = {}
    for u in units:
        examples.setdefault(u["norm"], u["example"])
    if not examples:
        return
    layers = max(e.shape[0] for e in examples.values())
    fig, axes = plt.subplots(
        len(examples), layers, squeeze=False, figsize=(2.6 * layers + 1, 2.4 * len(examples))
    )
    for row, (norm, ex) in enumerate(examples.items()):
        for layer in range(layers):
            ax = axes[row, layer]
            if layer >= ex.shape[0]:
                ax.axis("off")
                continue
            im = ax.imshow(np.abs(ex[layer, 0]), cmap="viridis")
            ax.set_title(f"{norm}, layer {layer}, head 0", fontsize=8)
            ax.set_xlabel("key position")
            ax.set_ylabel("query position")
            fig.colorbar(im, ax=ax, fraction=0.046)
    fig.suptitle("|attention| of seed 0's first test sequence")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _interval_bars(ax, summary: dict) -> None:
    """Sink-head share per normalization with its bootstrap 90% interval."""
    _bars(
        ax,
        summary,
        "sink_share",
        "share of sink heads (score > 0.9)",
        note=lambda e: f"{e['qualified']}/{e['runs']} runs",
    )
    for i, e in enumerate(summary["by_norm"].values()):
        if e.get("sink_share_90"):
            lo, hi = e["sink_share_90"]
            ax.plot([i, i], [lo, hi], color="black", lw=1.5)


def emergence(config, summary: dict, units: list, path: Path) -> None:
    """Heads x steps heatmaps of the sink score (seed 0 of each normalization), and the
    sink-head share against step per normalization (mean over seeds)."""
    firsts = {}
    for u in units:
        if "history_bos_score" in u:
            firsts.setdefault(u["norm"], u)
    if not firsts:
        return
    fig, axes = plt.subplots(1, len(firsts) + 1, figsize=(3.6 * (len(firsts) + 1), 3.4), squeeze=False)
    for ax, (norm, u) in zip(axes[0], firsts.items()):
        scores = u["history_bos_score"]  # [records, layers, heads]
        steps = u["history_step"]
        grid = scores.reshape(len(steps), -1).T
        im = ax.imshow(
            grid, aspect="auto", cmap="viridis", vmin=0, vmax=1, interpolation="nearest",
            extent=(steps[0], steps[-1], grid.shape[0] - 0.5, -0.5),
        )  # fmt: skip
        layers, heads = scores.shape[1:]
        ax.set_yticks(range(layers * heads), [f"L{la}H{h}" for la in range(layers) for h in range(heads)])
        ax.set_xlabel("training step")
        ax.set_ylabel("layer, head")
        ax.set_title(f"{norm}, seed {u['seed']}: sink score", fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.046)
    ax = axes[0, -1]
    for norm, e in summary["by_norm"].items():
        if "emergence_steps" in e:
            ax.plot(e["emergence_steps"], e["emergence_sink_share"], label=norm)
    ax.set_xlabel("training step")
    ax.set_ylabel(f"share of layer-{config.sink_layer} heads with score > 0.9")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("sink heads as they emerge (mean over seeds)", fontsize=9)
    if ax.lines:
        ax.legend(fontsize=7)
    else:  # every run failed (summary.json: failed_runs)
        ax.text(0.5, 0.5, "no run that did not fail", ha="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def draw(config, summary: dict, units: list, out) -> None:
    """Write the task's figures into `out`."""
    out = Path(out)
    if not units:
        return
    if config.task == "induction":
        fig, axes = plt.subplots(1, 3, figsize=(16, 4))
        _interval_bars(axes[0], summary)
        axes[0].set_title(
            f"sink heads of layer {config.sink_layer}, runs with accuracy > 0.95\n(bars: 90% bootstrap)"
        )
        qualified = [u for u in units if u["accuracy"] > 0.95]
        for u in qualified:
            u["sink_layer_score"] = u["sink_score"][config.sink_layer]
        _scatter(
            axes[1], summary, qualified, "sink_layer_score", f"sink score per head, layer {config.sink_layer}"
        )
        axes[1].axhline(0.9, color="gray", ls="--", lw=1)
        axes[1].set_ylim(-0.05, 1.05)
        axes[1].set_title("every counted head of the qualifying runs")
        _scatter(axes[2], summary, units, "accuracy", "induction accuracy")
        axes[2].axhline(0.95, color="gray", ls="--", lw=1)
        axes[2].set_title("accuracy per run")
    else:
        fig, axes = plt.subplots(1, 3, figsize=(15, 4))
        _bars(
            axes[0], summary, "flip_rate", "single-token attack flip rate", note=lambda e: f"{e['runs']} runs"
        )
        axes[0].set_title(f"flip rate ({config.pairs} pairs per run)")
        _bars(axes[1], summary, "sparsity", "CLS-row max/sum (mean over heads)")
        axes[1].set_title("sparsity of the CLS attention")
        _scatter(axes[2], summary, units, "accuracy", "classification accuracy")
        axes[2].set_title("accuracy per run")
    fig.tight_layout()
    fig.savefig(out / f"{config.task}.png", dpi=110)
    plt.close(fig)
    _maps(config, units, out / "attention_maps.png")
    if config.task == "induction":
        emergence(config, summary, units, out / "emergence.png")


def heatmap(table: dict, path, title: str = "") -> None:
    """Per-layer, per-head heatmaps of a `sinks.head_table`."""
    cols = [c for c in ("bos_share", "sparsity", "entropy", "alpha") if c in table]
    fig, axes = plt.subplots(1, len(cols), figsize=(3.4 * len(cols), 3), squeeze=False)
    for ax, c in zip(axes[0], cols):
        im = ax.imshow(table[c], cmap="viridis", aspect="auto")
        ax.set_title(c)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        fig.colorbar(im, ax=ax)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def sink_series(frame, path, title: str = "") -> None:
    """Sink rate (`Sink_k^eps`, %) and mean alpha_k of each checkpoint against its training
    step: a frame with columns `step`, `sink_rate`, `mean_alpha` (one row per checkpoint)."""
    frame = frame.sort_values("step")
    fig, left = plt.subplots(figsize=(5.5, 3.4))
    left.plot(frame["step"], 100 * frame["sink_rate"], "o-", color="tab:blue", label="sink rate")
    left.set_xlabel("training step")
    left.set_ylabel("sink rate Sink_k^eps (% of heads)", color="tab:blue")
    left.set_ylim(-2, 102)
    right = left.twinx()
    right.plot(frame["step"], frame["mean_alpha"], "s--", color="tab:orange", label="mean alpha_k")
    right.set_ylabel("mean alpha_k over heads", color="tab:orange")
    right.set_ylim(0, 1.02)
    left.set_title(title or "sinks across checkpoints")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
