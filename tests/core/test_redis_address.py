"""A Redis address, parsed once (:mod:`streamer_core.options.redis_address`): the
forms every setting, argument and flag takes, the one default, and the
password kept out of every message and repr. Nothing here connects."""

from __future__ import annotations

import inspect

import pytest

from streamer_core import RedisStreamer, RedisWorker, run_redis_workers_forever
from streamer_core.cli import build_parser
from streamer_core.options.config import OPTIONS
from streamer_core.options.redis_address import ADDRESS_FORMS, DEFAULT_REDIS, RedisAddress


@pytest.mark.parametrize(
    "text, kind, hosts, db",
    [
        ("localhost:6379", "server", (("localhost", 6379),), 0),
        ("[::1]:6380", "server", (("::1", 6380),), 0),
        ("redis://:pw@10.0.0.2:6390/4", "server", (("10.0.0.2", 6390),), 4),
        ("rediss://user:pw@cache.example:6380", "server", (("cache.example", 6380),), 0),
        ("redis://127.0.0.1", "server", (("127.0.0.1", 6379),), 0),
        ("unix:///run/redis.sock?db=2", "server", (), 2),
        ("redis+sentinel://s1,s2:26380/mymaster/1", "sentinel", (("s1", 26379), ("s2", 26380)), 1),
        ("redis+cluster://n1:7000,n2:7001", "cluster", (("n1", 7000), ("n2", 7001)), 0),
    ],
)
def test_each_form_is_read_into_its_parts(text, kind, hosts, db):
    address = RedisAddress.parse(text)
    assert (address.kind, address.hosts, address.db) == (kind, hosts, db)
    assert RedisAddress.of(address) is address and RedisAddress.of(text) == address
    assert address.is_cluster == (kind == "cluster") and address.is_sentinel == (kind == "sentinel")


def test_host_and_port_is_a_redis_url_for_redis_py():
    assert RedisAddress.parse("localhost:6379").url == "redis://localhost:6379"
    assert RedisAddress.parse("::1:6380").url == "redis://[::1]:6380"


@pytest.mark.parametrize(
    "text, message",
    [
        ("rdis://127.0.0.1:6379/0", "rdis:// is none of them"),
        ("http://127.0.0.1:6379", "http:// is none of them"),
        ("nohost", "must be 'host:port'"),
        ("host:port", "must be 'host:port'"),
        ("", "must be 'host:port'"),
        ("redis://127.0.0.1:6379/zero", "the database must be a number"),
        ("redis://127.0.0.1:sixty/0", "the port must be a number"),
        ("rediss+sentinel://127.0.0.1/mymaster", "not supported"),
        ("rediss+cluster://127.0.0.1:7000", "not supported"),
    ],
)
def test_a_wrong_address_says_how_to_write_it(text, message):
    with pytest.raises(ValueError, match=message):
        RedisAddress.parse(text)
    if "none of them" in message or "must be 'host:port'" in message:
        with pytest.raises(ValueError) as raised:
            RedisAddress.parse(text)
        assert ADDRESS_FORMS in str(raised.value)


@pytest.mark.parametrize(
    "text, shown",
    [
        ("redis://user:p@ss@host:6379/0", "redis://***@host:6379/0"),
        ("redis+sentinel://:p@ss@s1:26379/mymaster/0", "redis+sentinel://***@s1:26379/mymaster/0"),
    ],
)
def test_a_password_holding_an_at_sign_is_hidden_whole(text, shown):
    """The password is read up to the last '@', as redis-py reads it: the
    redacted form hides it up to there too, not only its first part."""
    from streamer_core.options.redis_address import redact_url

    address = RedisAddress.parse(text)
    assert address.password == "p@ss"
    for written in (str(address), repr(address), address.redacted, redact_url(text)):
        assert "ss@" not in written and "p@ss" not in written, written
    assert address.redacted == shown


def test_the_password_is_in_no_message_and_no_repr():
    address = RedisAddress.parse("redis+sentinel://:hunter2@s1/mymaster/0?sentinel_password=hunter3")
    assert (address.password, address.sentinel_password) == ("hunter2", "hunter3")
    for shown in (str(address), repr(address), address.redacted, repr(OPTIONS["redis_url"].checked(address))):
        assert "hunter" not in shown, shown
    with pytest.raises(ValueError) as raised:
        RedisAddress.parse("redis://:hunter2@127.0.0.1:6379/x")
    assert "hunter2" not in str(raised.value)


@pytest.mark.parametrize(
    "text",
    [
        "rdis://:hunter2@h:6379/0",  # no scheme we know
        "redis://:hunter2@h:port/0",
        "redis://:hunter2@h:6379/x",
        "redis+sentinel://:hunter2@s1/mymaster/x?sentinel_password=hunter3",
        "redis+sentinel://:hunter2@s1/mymaster/0?sentinel_password=hunter3&db=1",
        "redis+sentinel://:hunter2@s1:xx/mymaster?sentinel_password=hunter3",
        "redis+sentinel://:hunter2@/mymaster",
        "redis+sentinel://:hunter2@s1",
        "redis+cluster://:hunter2@n1:7000/3",
        "redis+cluster://:hunter2@n1:7000?sentinel_password=hunter3",
        "redis+sentinel://s1/mymaster/0?Sentinel_Password=hunter3&retry=1",  # a name in another case, still a password
    ],
)
def test_a_wrong_address_is_refused_without_its_passwords(text):
    with pytest.raises(ValueError) as raised:
        RedisAddress.parse(text)
    assert "hunter" not in str(raised.value), raised.value
    assert "***" in str(raised.value) or "//" not in str(raised.value), raised.value


def test_one_default_everywhere():
    """service_streamer's ``localhost:6379``, the same for the web side,
    the workers, their supervisor and the worker command."""
    for made_by in (RedisStreamer.__init__, RedisWorker.__init__, run_redis_workers_forever):
        assert inspect.signature(made_by).parameters["redis_broker"].default == DEFAULT_REDIS, made_by
    assert build_parser().parse_args(["m:f"]).redis in (
        DEFAULT_REDIS,
        __import__("os").environ.get("STREAMER_REDIS_URL"),
    )
    assert OPTIONS["redis_url"].default is None  # the web layers' setting: required for the redis backend


def test_the_setting_is_the_address_parsed_once():
    assert OPTIONS["redis_url"].checked("127.0.0.1:6379") == RedisAddress.parse("127.0.0.1:6379")
    with pytest.raises(ValueError, match="STREAMER_REDIS_URL must be 'host:port'"):
        OPTIONS["redis_url"].checked(6379, "STREAMER_REDIS_URL")
