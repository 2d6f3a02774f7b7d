"""settings.STREAMER is checked by Django's system checks, with stable ids,
and nothing is started by checking, migrating or importing."""

from __future__ import annotations

from typing import Any, Dict, List

import pytest
from django.core import checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from django_streamer import started_models
from django_streamer.checks import HINTS

GOOD = {"m": {"MODEL": "tests.django.batch_models.double"}}


def errors(streamer_settings: Any, models: Any = GOOD, **top: Any) -> List[checks.CheckMessage]:
    """The settings' errors (not E010: the test project's views name models these settings may lack)."""
    streamer_settings(models, **top)
    return [
        m
        for m in checks.run_checks()
        if m.id and m.id.startswith("django_streamer.") and m.id != "django_streamer.E010"
    ]


def ids(messages: List[checks.CheckMessage]) -> List[str]:
    return sorted(m.id for m in messages)


def test_the_test_projects_settings_pass():
    assert [m for m in checks.run_checks() if m.id and m.id.startswith("django_streamer.")] == []
    call_command("check")  # raises SystemCheckError if anything is wrong


@pytest.mark.parametrize(
    "value, expected",
    [
        ("not a dict", "must be a dict"),
        ({"BACKEND": "thread"}, "it is not set"),
        ({"MODELS": {}}, "at least one model"),
        ({"MODELS": {"m": "tests.django.batch_models.double"}}, "must be a dict such as"),
        ({"MODELS": {"a:b": {"MODEL": "tests.django.batch_models.double"}}}, "without ':'"),
    ],
)
def test_e001_the_shape_of_the_setting(settings, value, expected):
    settings.STREAMER = value
    found = [m for m in checks.run_checks() if m.id == "django_streamer.E001"]
    assert len(found) == 1 and expected in found[0].msg, found
    assert found[0].hint == HINTS["django_streamer.E001"]


def test_e001_streamer_missing(settings):
    del settings.STREAMER
    [found] = [m for m in checks.run_checks() if m.id and m.id.startswith("django_streamer.")]  # no E010 without MODELS
    assert found.id == "django_streamer.E001" and "not set" in found.msg


def test_e002_unknown_backend_names_the_setting(streamer_settings):
    [error] = errors(streamer_settings, BACKEND="gpu")
    assert error.id == "django_streamer.E002"
    assert "STREAMER['BACKEND'] is 'gpu'" in error.msg and "'thread'" in error.msg
    [error] = errors(streamer_settings, {"m": {"MODEL": "tests.django.batch_models.double", "BACKEND": "celery"}})
    assert "STREAMER['MODELS']['m']['BACKEND'] is 'celery'" in error.msg


def test_a_setting_read_from_the_environment_is_named_by_its_variable(streamer_settings, monkeypatch):
    """``STREAMER["ENVIRONMENT"]`` names the variable each setting was read
    from: a problem names it where it is set, and the path alone where not."""
    model = {"MODEL": "tests.django.batch_models.double", "BATCH_SIZE": 0}
    environment = {"BACKEND": "MY_BACKEND", "MODELS": {"m": {"BATCH_SIZE": "MY_SIZE"}}}
    monkeypatch.setenv("MY_BACKEND", "gpu")
    monkeypatch.setenv("MY_SIZE", "0")
    found = errors(streamer_settings, {"m": model}, BACKEND="gpu", ENVIRONMENT=environment)
    assert sorted(error.msg.split(" must ")[0].split(" is ")[0] for error in found) == [
        "MY_BACKEND in the environment (STREAMER['BACKEND'])",
        "MY_SIZE in the environment (STREAMER['MODELS']['m']['BATCH_SIZE'])",
    ], [error.msg for error in found]
    monkeypatch.delenv("MY_SIZE")  # the file's own value, then: named by its path
    found = errors(streamer_settings, {"m": model}, BACKEND="thread", ENVIRONMENT=environment)
    assert [error.msg.split(" must ")[0] for error in found] == ["STREAMER['MODELS']['m']['BATCH_SIZE']"]
    [error] = errors(streamer_settings, ENVIRONMENT={"BACKEND": 1})
    assert error.id == "django_streamer.E001" and "STREAMER['ENVIRONMENT']['BACKEND'] must be a dict" in error.msg


@pytest.mark.parametrize(
    "model, expected",
    [
        ("tests.django.no_such_module.Model", "does not import"),
        ("tests.django.batch_models.Nope", "has no attribute"),
        ("nodots", "module:attribute"),
        ("tests.django.batch_models.NotManaged", "not a ManagedModel subclass"),
        ("tests.django.batch_models.NOT_A_MODEL", "give a function"),
    ],
)
def test_e003_a_model_that_does_not_import_or_is_not_a_model(streamer_settings, model, expected):
    [error] = errors(streamer_settings, {"m": {"MODEL": model}})
    assert error.id == "django_streamer.E003"
    assert expected in error.msg and "STREAMER['MODELS']['m']['MODEL']" in error.msg


def test_e003_a_model_entry_without_model(streamer_settings):
    [error] = errors(streamer_settings, {"m": {"BATCH_SIZE": 4}})
    assert error.id == "django_streamer.E003" and "is not set" in error.msg


@pytest.mark.parametrize(
    "key, value",
    [
        ("BATCH_SIZE", 0),
        ("BATCH_SIZE", -3),
        ("BATCH_SIZE", 2.5),
        ("BATCH_SIZE", True),
        ("WORKER_NUM", 0),
        ("MODEL_THREADS", 0),
        ("MAX_QUEUE", 0),
        ("MAX_QUEUE", "10"),
    ],
)
def test_e004_non_positive_or_non_int_sizes(streamer_settings, key, value):
    [error] = errors(streamer_settings, {"m": {"MODEL": "tests.django.batch_models.double", key: value}})
    assert error.id == "django_streamer.E004"
    assert f"STREAMER['MODELS']['m']['{key}']" in error.msg


def test_a_bad_top_level_default_is_reported_once_for_every_model(streamer_settings):
    models = {name: {"MODEL": "tests.django.batch_models.double"} for name in ("a", "b", "c")}
    [error] = errors(streamer_settings, models, BATCH_SIZE=0)
    assert error.id == "django_streamer.E004" and "STREAMER['BATCH_SIZE']" in error.msg


@pytest.mark.parametrize(
    "key, value",
    [
        ("MAX_LATENCY", -0.1),
        ("MAX_LATENCY", "0.05"),
        ("TIMEOUT", 0),
        ("TIMEOUT", float("inf")),
        ("TIMEOUT", 86_401),
        ("MAX_LATENCY", 1e12),
    ],
)
def test_e005_bad_seconds(streamer_settings, key, value):
    [error] = errors(streamer_settings, {"m": {"MODEL": "tests.django.batch_models.double", key: value}})
    assert error.id == "django_streamer.E005" and "seconds" in error.msg


@pytest.mark.parametrize("value", [True, -1, [], [0.5], [-1], [True], {"gpu": 0}, "gpu0", ["cuda:x"], "GPU-"])
def test_e006_devices_of_the_wrong_type(streamer_settings, value):
    found = errors(streamer_settings, {"m": {"MODEL": "tests.django.batch_models.double", "CUDA_DEVICES": value}})
    assert ids(found) == ["django_streamer.E006"], found


@pytest.mark.parametrize("value", [[0, 1], "0,1", ["GPU-5d0e7f9a"], None, 0, 1, "0", "cuda:0", ["cuda:1", 0]])
def test_good_devices_pass(streamer_settings, value):
    assert errors(streamer_settings, {"m": {"MODEL": "tests.django.batch_models.double", "CUDA_DEVICES": value}}) == []


def test_e007_redis_backend_without_url(streamer_settings):
    [error] = errors(streamer_settings, BACKEND="redis", REDIS_URL=None)
    assert error.id == "django_streamer.E007" and "STREAMER['REDIS_URL'] must be set" in error.msg
    [error] = errors(streamer_settings, BACKEND="redis", REDIS_URL="nonsense")
    assert error.id == "django_streamer.E007"
    assert errors(streamer_settings, BACKEND="redis", REDIS_URL="redis://127.0.0.1:6379/0") == []
    sentinels = "redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/mymaster/0"
    assert errors(streamer_settings, BACKEND="redis", REDIS_URL=sentinels) == []
    [error] = errors(streamer_settings, BACKEND="redis", REDIS_URL="redis+sentinel://127.0.0.1:26379/mymaster/zero")
    assert error.id == "django_streamer.E007" and "the database must be a number" in error.msg
    for typo in ("rdis://127.0.0.1:6379/0", "redis+sentinal://127.0.0.1:26379/mymaster/0", "http://127.0.0.1:6379"):
        [error] = errors(streamer_settings, BACKEND="redis", REDIS_URL=typo)
        scheme = typo.partition("://")[0]
        assert error.id == "django_streamer.E007" and f"{scheme}:// is none of them" in error.msg, error.msg
        assert "redis+sentinel://" in error.msg and "redis+cluster://" in error.msg


def test_e008_unknown_keys_with_did_you_mean(streamer_settings):
    found = errors(
        streamer_settings,
        {"m": {"MODEL": "tests.django.batch_models.double", "BATCHSIZE": 4}},
        MAX_LATNECY=0.1,
        INIT_KWARGS={},
    )
    assert ids(found) == ["django_streamer.E008"] * 3
    text = "\n".join(m.msg for m in found)
    assert "'BATCHSIZE': did you mean 'BATCH_SIZE'?" in text
    assert "'MAX_LATNECY': did you mean 'MAX_LATENCY'?" in text
    assert "INIT_KWARGS belongs in each model's entry" in text


@pytest.mark.parametrize(
    "entry, top",
    [
        ({"CODEC": "json"}, {}),
        ({"INIT_KWARGS": [1]}, {}),
        ({"INIT_ARGS": "x"}, {}),
        ({}, {"PREFIX": ""}),
        ({"ITEM_COST": "tests.django.batch_models.nothing"}, {}),
        ({"ITEM_COST": 3}, {}),
        ({"MAX_BATCH_COST": 0}, {}),
        ({}, {"MAX_BATCH_COST": "big"}),
        ({"BATCH_COST": "mean"}, {}),
        ({"BACKEND": "process", "MODEL_THREADS": 2}, {}),
        ({"MODEL_THREADS": 2}, {"BACKEND": "redis", "REDIS_URL": "redis://127.0.0.1:6379/0"}),
    ],
)
def test_e009_other_options(streamer_settings, entry, top):
    found = errors(streamer_settings, {"m": dict({"MODEL": "tests.django.batch_models.double"}, **entry)}, **top)
    assert ids(found) == ["django_streamer.E009"], found


def test_e010_a_batched_view_of_a_model_the_settings_lack(settings):
    settings.ROOT_URLCONF = "tests.django.urls_unknown_model"
    [error] = [m for m in checks.run_checks() if m.id == "django_streamer.E010"]
    assert "'api/ghost'" in error.msg and "'ghost'" in error.msg and "'double'" in error.msg


def test_every_error_has_a_hint_and_errors_accumulate(streamer_settings):
    found = errors(
        streamer_settings,
        {"m": {"MODEL": "nowhere.Model", "BATCH_SIZE": 0, "TIMEOUT": -1, "CUDA_DEVICES": [None], "BACKEND": "redis"}},
        REDIS_URL=None,
    )
    assert ids(found) == [f"django_streamer.E00{n}" for n in (3, 4, 5, 6, 7)]
    assert all(m.hint and m.level == checks.ERROR for m in found)


def test_call_command_check_fails_on_bad_settings(streamer_settings):
    streamer_settings(BACKEND="gpu")
    with pytest.raises(SystemCheckError, match="django_streamer.E002"):
        call_command("check")


def test_a_model_path_with_a_colon_imports(streamer_settings):
    assert (
        errors(
            streamer_settings,
            {"m": {"MODEL": "tests.django.batch_models:HoldModel", "INIT_KWARGS": {"folder": "/tmp"}}},
        )
        == []
    )


def test_checking_starts_no_streamer(settings, streamer_settings, tmp_path):
    marked = {"MODEL": "tests.django.batch_models.MarkedModel", "INIT_KWARGS": {"folder": str(tmp_path)}}
    streamer_settings(dict(settings.STREAMER["MODELS"], marked=marked))
    call_command("check")
    assert started_models() == []
    assert list(tmp_path.iterdir()) == []


def _env(commands: Any, folder: Any, **extra: str) -> Dict[str, str]:
    return commands.env(TEST_STREAMER_FOLDER=str(folder), TEST_DJANGO_DB=str(folder / "db.sqlite3"), **extra)


def test_manage_check_and_migrate_start_nothing(commands, tmp_path):
    """As subprocesses, the way a developer runs them: nothing is built (the
    thread backend would build MarkedModel, writing its mark, at once)."""
    env = _env(commands, tmp_path)
    check = commands.run("check", env=env)
    assert check.returncode == 0, check.stderr
    assert "System check identified no issues" in check.stdout
    migrate = commands.run("migrate", "--noinput", env=env)
    assert migrate.returncode == 0, migrate.stderr
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("built-")] == []


def test_manage_check_reports_the_id_and_fails(commands, tmp_path):
    result = commands.run("check", env=_env(commands, tmp_path, TEST_STREAMER_BACKEND="redis"))
    assert result.returncode == 1
    assert "django_streamer.E007" in result.stderr and "HINT: Set REDIS_URL" in result.stderr
