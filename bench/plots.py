"""The benchmarks' pictures: PNG files drawn from the same rows as their
tables, so that a figure in README.md is what a run measured, never drawn by
hand.

Three figures, each from a list of :class:`Point` (one measured run of one
deployment at one number of connections):

- :func:`throughput_figure`: requests/s against concurrency, one line per
  deployment, this project's solid and its peers' (service_streamer's,
  ``ss-``) dashed;
- :func:`latency_figure`: the latency distribution of each deployment at one
  concurrency, as its percentiles (p50 to the slowest request);
- :func:`cpu_figure`: the CPU each request cost, stacked by the role of the
  process that spent it (web processes, model workers, Redis, the load
  generator).

matplotlib (the ``bench`` extra) draws them with its Agg backend: files
only, no display needed, on a server or in CI.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence

__all__ = ["Point", "throughput_figure", "latency_figure", "cpu_figure", "write_figures", "PEER_PREFIX"]

#: Deployments whose names start so are the peers', drawn dashed.
PEER_PREFIX = "ss-"
#: The order (and colours' order) of the process roles in :func:`cpu_figure`.
ROLE_ORDER = ("web", "workers", "redis", "wrk")


@dataclass(frozen=True)
class Point:
    """One measured run: ``deployment`` under ``connections`` concurrent
    connections served ``rps`` requests/s; ``latency_ms`` maps a percentile
    (50, 99, 100 for the slowest) to milliseconds; ``cpu_ms`` a process role
    to its CPU milliseconds per request."""

    deployment: str
    connections: int
    rps: float
    latency_ms: Mapping[float, float] = field(default_factory=dict)
    cpu_ms: Mapping[str, float] = field(default_factory=dict)


def _pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (files only), imported here so
    that the benchmarks run, and say what to install, without it."""
    try:
        import matplotlib
    except ImportError:
        raise RuntimeError("the plots need matplotlib: pip install -e '.[bench]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    return pyplot


def _deployments(points: Sequence[Point]) -> List[str]:
    """The deployments in the order they first appear (the benchmark's)."""
    return list(dict.fromkeys(point.deployment for point in points))


def _save(figure: Any, path: str) -> str:
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    _pyplot().close(figure)
    return path


def throughput_figure(points: Sequence[Point], path: str, title: str = "") -> str:
    """Requests/s against concurrent connections, a line per deployment;
    written to ``path`` (PNG), which is returned."""
    pyplot = _pyplot()
    figure, axes = pyplot.subplots(figsize=(7.0, 4.2))
    for deployment in _deployments(points):
        mine = sorted((p for p in points if p.deployment == deployment), key=lambda p: p.connections)
        style = "--" if deployment.startswith(PEER_PREFIX) else "-"
        axes.plot([p.connections for p in mine], [p.rps for p in mine], style, marker="o", label=deployment)
    connections = sorted({p.connections for p in points})
    if len(connections) > 1 and connections[-1] / max(1, connections[0]) >= 8:
        axes.set_xscale("log", base=2)
    axes.set_xticks(connections, [str(c) for c in connections])
    axes.set_xlabel("concurrent connections (wrk)")
    axes.set_ylabel("requests/s")
    axes.set_ylim(bottom=0)
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize="small")
    axes.set_title(title or "Throughput against concurrency", fontsize="medium")
    return _save(figure, path)


def latency_figure(points: Sequence[Point], path: str, title: str = "", connections: Optional[int] = None) -> str:
    """Each deployment's latency percentiles at ``connections`` (default:
    the most measured), milliseconds on a log scale; written to ``path``."""
    pyplot = _pyplot()
    at = connections if connections is not None else max(p.connections for p in points)
    figure, axes = pyplot.subplots(figsize=(7.0, 4.2))
    ticks: Dict[float, str] = {}
    for deployment in _deployments(points):
        mine = [p for p in points if p.deployment == deployment and p.connections == at and p.latency_ms]
        if not mine:
            continue
        latency = mine[0].latency_ms
        ranks = sorted(latency)
        # x: how many nines, so p50, p90, p99, p99.9 are evenly apart; the slowest last.
        xs = [_nines(rank) for rank in ranks]
        style = "--" if deployment.startswith(PEER_PREFIX) else "-"
        axes.plot(xs, [latency[rank] for rank in ranks], style, marker="o", label=deployment)
        ticks.update({_nines(rank): _rank_label(rank) for rank in ranks})
    axes.set_xticks(list(ticks), list(ticks.values()))
    axes.set_yscale("log")
    plain = _plain_numbers()
    axes.yaxis.set_major_formatter(plain)
    axes.yaxis.set_minor_formatter(plain)
    axes.set_xlabel("percentile")
    axes.set_ylabel("latency, ms (log)")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize="small")
    axes.set_title(title or f"Latency at {at} connections", fontsize="medium")
    return _save(figure, path)


def _plain_numbers() -> Any:
    """Tick labels as plain numbers (60, 200), not powers of ten (6x10^1)."""
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda value, _: f"{value:g}")


def _nines(rank: float) -> float:
    """A percentile's place on the x axis: 50 -> 0.3, 90 -> 1, 99 -> 2,
    99.9 -> 3; the slowest (100) one step past the last of these."""
    import math

    if rank >= 100:
        return 4.0
    return -math.log10(1 - rank / 100)


def _rank_label(rank: float) -> str:
    return "max" if rank >= 100 else f"p{rank:g}"


def cpu_figure(points: Sequence[Point], path: str, title: str = "", connections: Optional[int] = None) -> str:
    """CPU milliseconds per request by process role, a stacked bar per
    deployment at ``connections`` (default: the most measured); written to
    ``path``."""
    pyplot = _pyplot()
    at = connections if connections is not None else max(p.connections for p in points)
    chosen = {p.deployment: p for p in points if p.connections == at}
    deployments = [d for d in _deployments(points) if d in chosen]
    roles = [r for r in ROLE_ORDER if any(r in p.cpu_ms for p in chosen.values())]
    roles += sorted({r for p in chosen.values() for r in p.cpu_ms} - set(roles))
    figure, axes = pyplot.subplots(figsize=(7.0, 1.5 + 0.55 * max(1, len(deployments))))
    left = [0.0] * len(deployments)
    for role in roles:
        widths = [chosen[d].cpu_ms.get(role, 0.0) for d in deployments]
        axes.barh(deployments, widths, left=left, label=role)
        left = [a + b for a, b in zip(left, widths)]
    for row, total in enumerate(left):
        axes.text(total, row, f" {total:.2f}", va="center", fontsize="small")
    axes.invert_yaxis()  # the benchmark's order, top down
    axes.set_xlabel("CPU ms per request (the load generator's, wrk, included)")
    axes.set_xlim(right=max(left, default=1.0) * 1.15 or 1.0)
    axes.grid(True, axis="x", alpha=0.3)
    # Below the axes, where it covers no bar.
    axes.legend(fontsize="small", ncol=len(roles), loc="upper center", bbox_to_anchor=(0.5, -0.35), frameon=False)
    axes.set_title(title or f"CPU per request by process role, {at} connections", fontsize="medium")
    return _save(figure, path)


def write_figures(points: Sequence[Point], folder: str, name: str, subtitle: str = "") -> List[str]:
    """All three figures of ``points`` in ``folder``, named
    ``{name}-throughput.png``, ``{name}-latency.png`` and ``{name}-cpu.png``
    (the throughput figure only with two or more concurrencies); the paths
    written."""
    if not points:
        return []
    suffix = f"\n{subtitle}" if subtitle else ""
    at = max(p.connections for p in points)
    written = []
    if len({p.connections for p in points}) > 1:
        written.append(throughput_figure(points, os.path.join(folder, f"{name}-throughput.png"), "Throughput" + suffix))
    written.append(
        latency_figure(points, os.path.join(folder, f"{name}-latency.png"), f"Latency at {at} connections" + suffix)
    )
    if any(p.cpu_ms for p in points):
        written.append(
            cpu_figure(points, os.path.join(folder, f"{name}-cpu.png"), f"CPU per request, {at} connections" + suffix)
        )
    return written
