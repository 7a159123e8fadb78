"""The PNGs of `lightning-otel report` (dashboards/lightning_otel/dashboards/report.py gathers the numbers).

Each function draws one file and returns a sentence for the Markdown ("" when there is nothing to
say). Figures are built with matplotlib's object API and saved through the Agg canvas: no pyplot,
so no global backend state and no display is ever needed. Empty inputs give a plot that says
'no data' rather than an exception: a report of a quiet hour is still a report.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

DPI = 100


def _figure(columns: int):
    from matplotlib.figure import Figure

    figure = Figure(figsize=(5.5 * columns, 4.0), dpi=DPI, layout="constrained")
    return figure, figure.subplots(1, columns, squeeze=False)[0]


def _no_data(ax, text: str) -> None:
    ax.text(0.5, 0.5, f"no data\n({text})", ha="center", va="center", transform=ax.transAxes, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])


def reward_curve(path: Path, train_steps: list[tuple], versions: list[tuple], evaluation: Sequence[tuple] = ()) -> str:
    """Left: mean reward per train step. Right: mean rollout reward per policy version, training
    rollouts and, beside them, the held-out evaluation's (`evaluation`: report.ReportData's rows) with
    its 95% interval."""
    figure, (by_step, by_version) = _figure(2)
    points = [(step, reward) for step, _v, _r, _n, reward, *_ in train_steps if reward is not None]
    by_step.set_title("Mean reward per train step (train_steps)")
    if points:
        by_step.plot([p[0] for p in points], [p[1] for p in points], marker="o")
        by_step.set_xlabel("train step")
        by_step.set_ylabel("mean reward of the step's rollouts")
        by_step.xaxis.get_major_locator().set_params(integer=True)
        by_step.grid(alpha=0.3)
    else:
        _no_data(by_step, "no train steps in the window")
    rewarded = [(label, n, mean) for label, _all, n, mean in versions if mean is not None]
    by_version.set_title("Mean rollout reward per policy version (rollouts)")
    if rewarded or evaluation:
        # Versions are categories in the order they first served a rollout (labels may be "1, 2");
        # a version only the evaluation saw (the last one) comes after them.
        labels = [r[0] for r in rewarded]
        labels += [str(row[0]) for row in evaluation if str(row[0]) not in labels]
        x = list(range(len(labels)))
        if rewarded:
            by_version.plot(
                [labels.index(r[0]) for r in rewarded],
                [r[2] for r in rewarded],
                marker="s",
                color="tab:orange",
                label="training rollouts",
            )
        if evaluation:
            at = [labels.index(str(row[0])) for row in evaluation]
            means = [row[3] for row in evaluation]
            spread = [
                [m - row[4] for m, row in zip(means, evaluation)],
                [row[5] - m for m, row in zip(means, evaluation)],
            ]
            by_version.errorbar(
                at, means, yerr=spread, marker="o", color="tab:green", capsize=3, label="held-out eval (95%)"
            )
            by_version.legend(fontsize=8)
        sizes = {n for _label, n, _mean in rewarded}
        if len(rewarded) <= 8:
            for i, (_label, n, mean) in enumerate(rewarded):
                by_version.annotate(
                    f"n={n}", (i, mean), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8
                )
        elif len(sizes) == 1:  # too many points to label each; say it once when it is the same
            by_version.set_title(f"Mean rollout reward per policy version ({sizes.pop()} rollouts each)")
        every = max(1, len(labels) // 15)  # at most ~15 tick labels
        tilt = {"rotation": 30, "ha": "right", "rotation_mode": "anchor"} if len(labels) > 8 else {}
        by_version.set_xticks(x[::every], labels[::every], **tilt)
        by_version.set_xlabel("policy version that served the rollout's LLM calls")
        by_version.set_ylabel("mean rollout reward")
        by_version.margins(x=0.1, y=0.15)  # room for the n= labels
        by_version.grid(alpha=0.3)
    else:
        _no_data(by_version, "no rollouts with a reward")
    figure.savefig(path)
    return ""


def samples_per_rollout(path: Path, histogram: list[int], calls_per_rollout: list[tuple[int, int]]) -> str:
    """Training samples per rollout, summed over the window's steps; LLM calls per rollout without steps."""
    figure, (ax,) = _figure(1)
    if sum(histogram):
        sizes = list(range(1, len(histogram) + 1))
        rollouts = sum(histogram)
        samples = sum(size * count for size, count in zip(sizes, histogram))
        ax.bar_label(ax.bar(sizes, histogram), fontsize=8)
        ax.set_title(f"Training samples per rollout ({rollouts} rollouts, train_steps)")
        ax.set_xlabel("samples the rollout became (1 = all its LLM calls merged)")
        ax.set_ylabel("rollouts")
        note = f"Training samples: {rollouts} rollouts became {samples} samples ({samples / rollouts:.2f} per rollout)."
    elif calls_per_rollout:
        drawn = ax.bar([c for c, _ in calls_per_rollout], [n for _, n in calls_per_rollout], color="tab:gray")
        ax.bar_label(drawn, fontsize=8)
        ax.set_title("LLM calls per rollout (no train steps in the window)")
        ax.set_xlabel("LLM calls in the rollout")
        ax.set_ylabel("rollouts")
        note = "No train steps in the window: the histogram shows LLM calls per rollout instead of samples per rollout."
    else:
        ax.set_title("Samples per rollout")
        _no_data(ax, "no train steps and no rollouts in the window")
        note = "No train steps and no rollouts in the window: nothing to histogram."
    if sum(histogram) or calls_per_rollout:
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(axis="y", alpha=0.3)
    figure.savefig(path)
    return note


def latency(path: Path, per_model: list[tuple], sample: dict[str, list[float]]) -> str:
    """Left: p50 and p95 per model. Right: the distribution of call durations per model."""
    figure, (bars, spread) = _figure(2)
    bars.set_title("LLM call latency by model (llm_calls)")
    spread.set_title("LLM call duration distribution")
    if not per_model:
        _no_data(bars, "no LLM calls in the window")
        _no_data(spread, "no LLM calls in the window")
        figure.savefig(path)
        return ""
    x = list(range(len(per_model)))
    width = 0.38
    for offset, column, label in ((-width / 2, 2, "p50"), (width / 2, 3, "p95")):
        values = [row[column] or 0.0 for row in per_model]
        drawn = bars.bar([i + offset for i in x], values, width, label=label)
        bars.bar_label(drawn, fmt="%.0f", fontsize=8)
    bars.set_xticks(x, [f"{row[0]}\n({row[1]} calls)" for row in per_model])
    bars.set_xlim(-0.75, len(per_model) - 0.25)  # one model would otherwise fill the axes edge to edge
    bars.margins(y=0.1)
    bars.set_ylabel("ms")
    bars.legend()
    durations = [d for values in sample.values() for d in values if d > 0]
    if durations:
        import numpy as np

        low, high = min(durations), max(durations)
        # Latencies span orders of magnitude (a cached short answer vs a long generation): log bins then.
        log_scale = high / low > 50
        edges = np.geomspace(low, high, 40) if log_scale else np.linspace(low, high, 40)
        for model, values in sample.items():
            spread.hist([v for v in values if v > 0], bins=edges, histtype="step", linewidth=1.5, label=model)
        if log_scale:
            spread.set_xscale("log")
        spread.set_xlabel("duration (ms)")
        spread.set_ylabel("LLM calls")
        spread.legend(fontsize=8)
        spread.grid(alpha=0.3)
    else:
        _no_data(spread, "no call durations")
    figure.savefig(path)
    return ""
