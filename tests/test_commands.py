"""Every command the project ships answers ``--help``, as a newcomer's
first try of it: ``streamer-worker``, ``flask streamer run-workers`` and
``manage.py run_gpu_workers``, each run as a real program."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _run(args: List[str], settings: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    """``args`` from the repository's root, the project importable, with
    ``settings`` in the environment; its output captured as text."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(settings or {})}
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def _command(name: str, module: str) -> List[str]:
    """The installed console script, or the same entry point by module."""
    script = BIN / name
    return [str(script)] if script.exists() else [sys.executable, "-m", module]


COMMANDS = {
    "streamer-worker": lambda: _command("streamer-worker", "streamer_core.cli") + ["--help"],
    "flask streamer run-workers": lambda: (
        _command("flask", "flask") + ["--app", "example_flask", "streamer", "run-workers", "--help"]
    ),
    "manage.py run_gpu_workers": lambda: [sys.executable, "example_django/manage.py", "run_gpu_workers", "--help"],
}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_command_answers_help(name):
    result = _run(COMMANDS[name]())
    assert result.returncode == 0, f"{name} --help failed:\n{result.stderr[-3000:]}"
    text = result.stdout
    assert "--devices" in text and "--help" in text, text
    assert "devices[i % n]" in " ".join(text.split()), "the help says how devices are given out"
    assert "``" not in text, "help text is read in a terminal, not rendered from reStructuredText"
    assert "Traceback" not in result.stderr


def test_the_streamer_worker_help_gives_an_example_that_names_a_real_model():
    result = _run(COMMANDS["streamer-worker"]())
    [example] = [line for line in result.stdout.splitlines() if "streamer-worker example_models" in line] or [""]
    model = example.split("streamer-worker ", 1)[1].split()[0] if example else ""
    module, _, attribute = model.partition(":")
    assert module and attribute, result.stdout
    check = _run([sys.executable, "-c", f"import {module}; print({module}.{attribute}.__name__)"])
    assert check.returncode == 0 and check.stdout.strip() == attribute, check.stderr


def test_streamer_worker_finds_the_model_s_module_in_the_folder_it_runs_from(tmp_path):
    """``.venv/bin/streamer-worker example_models.embedding:...`` from the
    checkout's root, as the README runs it: the examples are not installed
    (the wheel holds the library only), so the command finds the model's
    module where it runs, as flask and gunicorn do, with no PYTHONPATH."""
    (tmp_path / "here_only.py").write_text("def double(batch):\n    return [2 * x for x in batch]\n")
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    found = []
    for model in ("here_only:nothing_here", "not_here:double"):
        done = subprocess.run(
            _command("streamer-worker", "streamer_core.cli") + [model, "--redis", "redis://127.0.0.1:1/0"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr[-2000:]
        found.append(done.stderr)
    assert "'here_only' has no attribute 'nothing_here'" in found[0], found[0][-2000:]
    assert "cannot import 'not_here'" in found[1], found[1][-2000:]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--batch-size", "0"], "--batch-size must be a whole number >= 1, got 0"),
        (["--devices", "0,-1"], "--devices holds -1: device indexes start at 0"),
        (["--devices", "-1"], "--devices holds -1: device indexes start at 0"),
        (["--batch-cost", "mean"], "--batch-cost must be 'max' (length times the costliest input"),
        (["--item-cost", "tests.redis.models:nothing_here"], "--item-cost is 'tests.redis.models:nothing_here', which"),
        (["--max-latency", "-1"], "--max-latency is in seconds and must be a finite number >= 0"),
        (["--redis", "rdis://127.0.0.1:6379/0"], "--redis must be 'host:port', a redis://"),
        (["--redis", "redis+sentinal://127.0.0.1:26379/mymaster"], "--redis must be 'host:port', a redis://"),
    ],
)
def test_streamer_worker_refuses_a_bad_option_by_its_flag_before_reaching_for_redis(flags, message):
    """Each option is checked by the option table's one check, its message
    naming the flag as typed; nothing starts, nothing waits for Redis."""
    command = _command("streamer-worker", "streamer_core.cli") + ["tests.redis.models:double"]
    result = _run(command + ["--redis", "redis://127.0.0.1:1/0", *flags])
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"streamer-worker: error: {message}" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("command", ["status", "run-workers"])
def test_a_redis_url_with_a_typo_in_its_scheme_is_said_in_one_line(command):
    """``rdis://`` passed every check: the example died with redis-py's
    traceback, the status command printed 44 lines. It is a wrong setting
    like any other, named, with the forms that are taken."""
    env_settings = {"FLASK_STREAMER_BACKEND": "redis", "FLASK_STREAMER_REDIS_URL": "rdis://127.0.0.1:6379/0"}
    args = _command("flask", "flask") + ["--app", "example_flask", "streamer", command]
    result = _run(args, env_settings)
    assert result.returncode == 2, result.stdout + result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith("Error: FLASK_STREAMER_REDIS_URL must be 'host:port', a redis://"), line
    assert "redis+sentinel://" in line and "redis+cluster://" in line and "rdis:// is none of them" in line, line


@pytest.mark.parametrize("command", ["status", "run-workers"])
def test_flask_streamer_commands_say_a_wrong_setting_in_a_line_each(command):
    """What a newcomer met: ``flask --app example_flask streamer status`` with
    a wrong setting printed a 36-line traceback of the app's factory. The
    commands load the app themselves and say each wrong setting in a line."""
    env_settings = {"FLASK_STREAMER_BACKEND": "proces", "FLASK_STREAMER_BATCH_SIZE": "0"}
    args = _command("flask", "flask") + ["--app", "example_flask", "streamer", command]
    result = _run(args, env_settings)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.splitlines() == [
        "Error: FLASK_STREAMER_BACKEND is 'proces'; use one of 'thread', 'process', 'redis'",
        "Error: FLASK_STREAMER_BATCH_SIZE must be a whole number >= 1, got 0",
    ], result.stderr
    assert result.stdout == "", "without --json, nothing on standard output"


@pytest.mark.parametrize(
    "env_settings, args, errors",
    [
        (
            {"FLASK_STREAMER_BATCH_SIZE": "0"},
            [],
            ["FLASK_STREAMER_BATCH_SIZE must be a whole number >= 1, got 0"],
        ),
        ({}, ["--route", "nope"], ["no batched route named nope; the app has stream, classify"]),
    ],
    ids=["wrong-setting", "unknown-route"],
)
def test_flask_status_json_is_json_when_it_cannot_ask(env_settings: dict, args: list, errors: list) -> None:
    """``status --json`` read by a script: what stops it is still one JSON
    object on standard output, not ok, saying why; the lines on standard
    error and exit status 2 stay."""
    command = _command("flask", "flask") + ["--app", "example_flask", "streamer", "status", "--json", *args]
    result = _run(command, env_settings)
    assert result.returncode == 2, result.stdout + result.stderr
    assert json.loads(result.stdout) == {"ok": False, "models": {}, "errors": errors}, result.stdout
    assert errors[0] in result.stderr, result.stderr


def test_streamer_worker_reads_its_redis_address_from_the_environment(monkeypatch):
    """``STREAMER_REDIS_URL``, as ``--help`` says, when ``--redis`` is not given."""
    from streamer_core.cli import build_parser
    from streamer_core.options.config import OPTIONS

    monkeypatch.setenv("STREAMER_REDIS_URL", "redis://10.1.2.3:6380/4")
    args = build_parser().parse_args(["tests.redis.models:double"])
    address = OPTIONS["redis_url"].checked(args.redis, "--redis")
    assert (address.hosts, address.db) == ((("10.1.2.3", 6380),), 4)
    monkeypatch.delenv("STREAMER_REDIS_URL")
    assert build_parser().parse_args(["tests.redis.models:double"]).redis == "localhost:6379"
