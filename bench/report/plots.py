"""The report's PNG plots (matplotlib, no display): bars per engine and test with their spread,
tokens per second against depth and against prompt length, each with its roofline drawn."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from bench.report.collect import Data, roofline_t_s  # noqa: E402
from bench.report.engines import ENGINES  # noqa: E402
from bench.report.stats import engine_summary  # noqa: E402

COLORS = dict(zip([e.id for e in ENGINES], plt.get_cmap("tab10").colors))


def measured(data: Data) -> list[str]:
    return [e.id for e in ENGINES if any(k[0] == e.id for k in data.speed)]


def bars(data: Data, path: Path) -> None:
    t = data.plan.main_threads
    tests = [f"pp{data.plan.pp}", f"tg{data.plan.tg}"]
    engines = measured(data)
    fig, axes = plt.subplots(1, len(tests), figsize=(11, 4.2))
    for ax, test in zip(axes, tests):
        for i, e in enumerate(engines):
            s = engine_summary(data.speed, e, t, test)
            if not s:
                continue
            ax.bar(i, s["median"], color=COLORS[e], yerr=[[s["median"] - s["min"]], [s["max"] - s["median"]]],
                   capsize=4)
            roof = roofline_t_s(data, e, t, test)
            if roof:
                ax.hlines(roof, i - 0.4, i + 0.4, colors="black", linestyles="--", linewidth=1.2,
                          label="roofline" if i == 0 else None)
        ax.set_xticks(range(len(engines)), [data.label(e) for e in engines], rotation=30, ha="right", fontsize=8)
        ax.set_title(f"{test}, {t} threads: median, min–max over rounds")
        ax.set_ylabel("tokens/s")
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def sweep(data: Data, path: Path, kind: str) -> None:
    """kind "depth": tg t/s against the cached tokens; "prompt": pp t/s against prompt length."""
    t, plan = data.plan.main_threads, data.plan
    if kind == "depth":
        points = [(d, f"tg{plan.tg}" if d == 0 else f"tg{plan.tg} @ d{d}") for d in sorted(plan.depths)]
    else:
        points = [(n, f"pp{n}") for n in sorted({*plan.prompts, plan.pp})]
    fig, ax = plt.subplots(figsize=(8, 4.8))
    for e in measured(data):
        xs, med, lo, hi, roof = [], [], [], [], []
        for x, test in points:
            s = engine_summary(data.speed, e, t, test)
            if s:
                xs.append(x), med.append(s["median"]), lo.append(s["min"]), hi.append(s["max"])
                roof.append(roofline_t_s(data, e, t, test))
        if not xs:
            continue
        ax.plot(xs, med, "o-", color=COLORS[e], label=data.label(e))
        ax.fill_between(xs, lo, hi, color=COLORS[e], alpha=0.2)
        if all(roof):
            ax.plot(xs, roof, "--", color=COLORS[e], linewidth=1)
    if kind == "depth":
        ax.set_xlabel("tokens already in the cache (depth)")
        ax.set_title(f"tg{plan.tg} against depth, {t} threads (dashed: each engine's bandwidth roofline)")
    else:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("prompt length (tokens)")
        ax.set_title(f"prompt processing against length, {t} threads (dashed: arithmetic roofline)")
    ax.set_ylabel("tokens/s")
    ax.set_yscale("log")
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def ratios(data: Data, path: Path, table: list[tuple[str, str, dict]]) -> None:
    """Every nanocompile/peer ratio: median and min–max over rounds; 1 is parity."""
    if not table:
        return
    fig, ax = plt.subplots(figsize=(8, 0.32 * len(table) + 1.2))
    for i, (pair, test, r) in enumerate(table):
        ax.errorbar(r["median"], i, xerr=[[r["median"] - r["min"]], [r["max"] - r["median"]]], fmt="o",
                    color=COLORS[pair.split("/")[0]], capsize=3)
    ax.axvline(1.0, color="grey", linewidth=1)
    ax.set_yticks(range(len(table)), [f"{data.label(p.split('/')[0])} / {data.label(p.split('/')[1])}: {test}"
                                      for p, test, _ in table], fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("nanocompile t/s over its peer's, per round (median, min–max)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
