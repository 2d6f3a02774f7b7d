"""The peers in ``bench/scale_bench.py`` (issue #41), without installing any
of them: which variants ``--variants`` names, the ratios to mosec and to
ours, where each peer's venv lives and when it counts as made, and the
commands and bodies a peer deployment starts and sends."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any, Dict, List

import pytest

from bench import peer_venvs, scale_bench
from bench.scale_bench import Result


def test_peers_names_all_three_and_stubbing_leaves_infinity_out() -> None:
    args = scale_bench.parse_args(["--variants", "ours-thread,peers"])
    assert args.variants == ["ours-thread", "mosec", "litserve", "infinity"]
    stubbed = scale_bench.parse_args(["--variants", "peers", "--stub-forward"])
    assert stubbed.variants == ["mosec", "litserve"]
    # Not run unless named.
    assert not set(scale_bench.PEER_VARIANTS) & set(scale_bench.parse_args([]).variants)


def test_ratios_to_mosec_and_to_ours() -> None:
    def run(variant: str, rps: float, web_ms: float) -> Result:
        return Result(variant, 128, rps=rps, p50_ms=1.0, p99_ms=2.0, cpu_ms={"web": web_ms, "wrk": 9.0})

    results = {
        "ours-thread": [run("ours-thread", 2000.0, 0.4)],
        "mosec": [run("mosec", 8000.0, 0.1)],
        "litserve": [Result("litserve", 128, failure="boom")],
    }
    lines = scale_bench.ratios(results)
    assert lines[1] == "| deployment | req/s ÷ mosec | CPU/req ÷ mosec | req/s ÷ ours-thread | CPU/req ÷ ours-thread |"
    assert "| ours-thread | 0.25x | 4.00x | 1.00x | 1.00x |" in lines  # wrk's CPU is not the server's
    assert "| mosec | 1.00x | 1.00x | 4.00x | 0.25x |" in lines
    assert not any(line.startswith("| litserve") for line in lines)
    assert scale_bench.ratios({"ss-thread": [run("ss-thread", 100.0, 1.0)]}) == []


def test_a_venv_counts_as_made_only_with_its_pins(tmp_path: Path) -> None:
    peer = peer_venvs.PEERS["mosec"]
    folder = peer.folder(str(tmp_path))
    assert folder == os.path.join(str(tmp_path), "mosec-0.9.8")
    assert not peer_venvs.is_made(folder, peer)
    os.makedirs(folder)
    marker = os.path.join(folder, peer_venvs.MARKER)
    with open(marker, "w") as handle:
        handle.write("mosec==0.9.7\n")
    assert not peer_venvs.is_made(folder, peer)
    with open(marker, "w") as handle:
        handle.write("\n".join(peer.requirements) + "\n")
    assert peer_venvs.is_made(folder, peer)
    assert peer_venvs.ensure("mosec", str(tmp_path)) == folder  # made: nothing installed
    assert peer_venvs.ensure("infinity", str(tmp_path), override="/elsewhere") == "/elsewhere"
    for each in peer_venvs.PEERS.values():
        assert peer_venvs.TORCH in each.requirements  # the CPU build on this machine; a looser pin fetches CUDA


def test_peer_deployments_start_from_their_venvs(tmp_path: Path) -> None:
    args = argparse.Namespace(
        peer_venvs={name: f"/venvs/{name}" for name in scale_bench.PEER_VARIANTS},
        images=False,
        stub_forward=False,
        precision="defaults",
    )
    mosec = scale_bench.Deployment("mosec", args, str(tmp_path))
    command, env = mosec.peer_command()
    assert command[0] == "/venvs/mosec/bin/python" and command[1].endswith(os.path.join("peers", "mosec_server.py"))
    assert os.path.isdir(env["BENCH_PEER_MODEL"]) or env["BENCH_PEER_MODEL"] == scale_bench.MODEL
    assert (mosec.route, json.loads(mosec.body)) == ("/inference", {"s": scale_bench.SENTENCE})
    litserve = scale_bench.Deployment("litserve", args, str(tmp_path))
    assert litserve.route == "/predict" and "--model" in litserve.peer_command()[0]
    infinity = scale_bench.Deployment("infinity", args, str(tmp_path))
    command, _ = infinity.peer_command()
    assert (
        command[:2] == ["/venvs/infinity/bin/infinity_emb", "v2"] and command[command.index("--batch-size") + 1] == "64"
    )
    assert (infinity.route, json.loads(infinity.body)["input"]) == ("/embeddings", [scale_bench.SENTENCE])
    assert command[command.index("--dtype") + 1] == "auto"  # as it ships: float32 on a CPU


def test_one_precision_reaches_every_server_of_the_comparison(tmp_path: Path, monkeypatch: Any) -> None:
    """``--precision bfloat16``: the examples' EMBEDDING_PRECISION, the
    peers' autocast (BENCH_PEER_PRECISION), infinity's --dtype; granian
    variants serve the examples' WSGI module."""
    args = scale_bench.parse_args(
        [
            "--precision",
            "bfloat16",
            "--variants",
            "ours-thread-granian,django-thread-granian,django-thread,mosec,infinity",
        ]
    )
    args.peer_venvs = {name: f"/venvs/{name}" for name in scale_bench.PEER_VARIANTS}
    started: Dict[str, Any] = {}

    def record(self: Any, command: List[str], env: Dict[str, str], name: str) -> Any:
        started[self.variant] = (command, env)
        return None

    monkeypatch.setattr(scale_bench.Deployment, "_group", record)  # what would start, not started
    for variant in args.variants:
        scale_bench.Deployment(variant, args, str(tmp_path)).start()
    command, env = started["ours-thread-granian"]
    assert command[1:3] == ["-m", "granian"] and command[-1] == "example_flask.wsgi:app"
    assert env["FLASK_EMBEDDING_PRECISION"] == "bfloat16" and env["FLASK_STREAMER_BACKEND"] == "thread"
    command, env = started["django-thread-granian"]
    assert command[-1] == "example_django.wsgi:application" and env["EMBEDDING_PRECISION"] == "bfloat16"
    assert started["django-thread"][1]["EMBEDDING_PRECISION"] == "bfloat16"
    assert started["mosec"][1]["BENCH_PEER_PRECISION"] == "bfloat16"
    assert started["mosec"][1]["BENCH_PEER_WORKERS"] == str(args.model_workers)
    infinity = started["infinity"][0]
    assert infinity[infinity.index("--dtype") + 1] == "bfloat16"


def test_many_bench_gives_infinity_the_dtype_asked_and_the_example_its_server(tmp_path: Path, monkeypatch: Any) -> None:
    from bench import many_bench

    started: List[List[str]] = []

    class Recorded:
        pid = 0

        def __init__(self, command: List[str], **options: Any) -> None:
            started.append(command)
            options["stdout"].close()  # the log the server would have written

    monkeypatch.setattr(many_bench.subprocess, "Popen", Recorded)  # the command line, not a server
    args = many_bench.parse_args(
        ["--infinity", "/venvs/infinity", "--infinity-dtype", "bfloat16", "--server", "granian"]
    )
    for name in ("ours", "infinity"):
        many_bench.Server(name, args, str(tmp_path)).start()
    ours, infinity = started
    assert ours[1:3] == ["-m", "granian"] and ours[-1] == "example_flask.wsgi:app"
    assert infinity[infinity.index("--dtype") + 1] == "bfloat16"


def test_many_bench_shows_the_median_round_with_the_range_and_skips_failed_rounds() -> None:
    from bench import many_bench

    runs = [
        many_bench.Run("ours", 32, inputs_per_s=rate, p50_ms=1.0, p99_ms=2.0, cpu_ms_per_input=rate / 100)
        for rate in (271.0, 191.0, 287.0, 240.0)
    ]
    runs.append(many_bench.Run("ours", 32, failure="RuntimeError: not ready"))
    runs += [many_bench.Run("infinity", 32, failure="RuntimeError: exited"), many_bench.Run("infinity", 1)]
    chosen = many_bench.median_runs(runs)
    assert [(run.server, run.per_request) for run in chosen] == [("ours", 32), ("infinity", 32), ("infinity", 1)]
    ours, failed, _ = chosen
    assert ours.inputs_per_s == 240.0 and ours.cpu_ms_per_input == 2.4  # the lower middle of four, whole
    assert sorted(ours.rounds) == [191.0, 240.0, 271.0, 287.0] and failed.failure == "RuntimeError: exited"
    args = many_bench.parse_args(["--per-request", "32", "--repeat", "4"])
    table = many_bench.report(chosen[:1], args)
    assert "median of 4 interleaved rounds" in table and "| 240 (191-287) |" in table
    with pytest.raises(SystemExit):
        many_bench.parse_args(["--repeat", "0"])
