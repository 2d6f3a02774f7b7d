"""``bench/plots.py`` draws the benchmarks' figures from their rows: fed a
few rows by hand (no benchmark runs), each function writes a real PNG, and
``scale_bench`` turns its runs into those rows and writes the figures
where ``--plots`` says."""

from __future__ import annotations

from pathlib import Path
from typing import List

import pytest

pytest.importorskip("matplotlib", reason="the plots need matplotlib (the bench and test extras)")

from bench import plots, scale_bench  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: A figure with axes, lines and text is tens of KB; an empty or broken one far less.
MIN_PNG_BYTES = 8_000

LATENCY = {50.0: 12.0, 90.0: 20.0, 99.0: 45.0, 99.9: 80.0, 100.0: 120.0}


def _points() -> List[plots.Point]:
    rows = []
    for deployment, rate in (("ours-thread", 600.0), ("ours-redis", 500.0), ("ss-thread", 150.0)):
        for connections, share in ((8, 0.4), (32, 0.8), (128, 1.0)):
            cpu = {"web": 0.5, "workers": 0.3 if "redis" in deployment else 0.0, "redis": 0.05, "wrk": 0.1}
            latency = {rank: ms * connections / 32 for rank, ms in LATENCY.items()}
            rows.append(plots.Point(deployment, connections, rate * share, latency, cpu))
    return rows


def _is_png(path: Path) -> bool:
    data = path.read_bytes()
    return data.startswith(PNG_SIGNATURE) and len(data) >= MIN_PNG_BYTES


@pytest.mark.parametrize("draw", [plots.throughput_figure, plots.latency_figure, plots.cpu_figure])
def test_each_figure_is_a_png(tmp_path: Path, draw) -> None:
    path = tmp_path / "deep" / "figure.png"  # its folder is made
    assert draw(_points(), str(path)) == str(path)
    assert _is_png(path), path.stat().st_size


def test_write_figures_writes_the_three_and_leaves_out_throughput_at_one_concurrency(tmp_path: Path) -> None:
    written = plots.write_figures(_points(), str(tmp_path), "scale", "a subtitle")
    assert [Path(p).name for p in written] == ["scale-throughput.png", "scale-latency.png", "scale-cpu.png"]
    assert all(_is_png(Path(p)) for p in written)
    one = [p for p in _points() if p.connections == 32]
    names = [Path(p).name for p in plots.write_figures(one, str(tmp_path / "one"), "scale")]
    assert names == ["scale-latency.png", "scale-cpu.png"]
    assert plots.write_figures([], str(tmp_path / "none"), "scale") == []


def test_scale_bench_turns_its_median_runs_into_points() -> None:
    def run(rps: float, connections: int) -> scale_bench.Result:
        return scale_bench.Result(
            "ours-thread", connections, rps=rps, cpu_ms={"web": rps / 1000}, latency_ms={50.0: rps / 100}
        )

    results = {
        "ours-thread": [run(100, 8), run(300, 8), run(200, 8), run(900, 64)],
        "ss-thread": [scale_bench.Result("ss-thread", 8, failure="it broke")],
    }
    points = scale_bench.plot_points(results)
    assert [(p.deployment, p.connections, p.rps) for p in points] == [("ours-thread", 8, 200), ("ours-thread", 64, 900)]
    assert points[0].cpu_ms == {"web": 0.2} and points[0].latency_ms == {50.0: 2.0}


def test_scale_bench_reads_several_connection_counts_and_a_plots_folder() -> None:
    args = scale_bench.parse_args(["--connections", "8,32,128", "--plots", "somewhere"])
    assert args.connections == [8, 32, 128] and args.plots == "somewhere"
    assert scale_bench.parse_args([]).plots == scale_bench.DEFAULT_PLOTS
    with pytest.raises(SystemExit):
        scale_bench.parse_args(["--connections", "8,many"])
