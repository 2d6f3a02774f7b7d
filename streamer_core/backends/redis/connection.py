"""Connecting to Redis: addresses, the errors that mean "Redis is not
there", waiting for it to answer, and URLs safe to print."""

from __future__ import annotations

import logging
import threading
import time
import urllib.parse
from typing import Any, Dict, List, NamedTuple, Optional, Tuple, Type

__all__ = [
    "CLUSTER_SCHEME",
    "ClusterAddress",
    "is_cluster_address",
    "on_node_of",
    "parse_cluster_url",
    "server_time_ms",
    "SENTINEL_SCHEME",
    "SentinelAddress",
    "ServerIdentity",
    "check_address",
    "connect",
    "parse_sentinel_url",
    "redact_url",
    "setup_refused",
    "wait_for_broker",
    "broker_errors",
    "broker_problem",
    "LoopErrors",
    "MAX_BACKOFF_S",
]

logger = logging.getLogger("streamer_core.redis")

#: The longest pause between two tries while Redis does not answer, seconds.
MAX_BACKOFF_S = 2.0


#: The scheme of a Redis address that names Sentinels and a service.
SENTINEL_SCHEME = "redis+sentinel"
#: Sentinel's port when the URL gives none.
SENTINEL_PORT = 26379


class SentinelAddress(NamedTuple):
    """Where a Sentinel-watched Redis is: the Sentinels to ask, the name of
    the service they watch (its master), the database, and the passwords."""

    sentinels: Tuple[Tuple[str, int], ...]
    service: str
    db: int
    username: Optional[str]
    password: Optional[str]
    sentinel_password: Optional[str]


def parse_sentinel_url(url: str) -> Optional[SentinelAddress]:
    """``redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/service[/db]
    [?sentinel_password=...]`` as a :class:`SentinelAddress`; ``None`` for an
    address of another scheme. The password is the master's (and its
    replicas'); ``sentinel_password`` the Sentinels' own, where they have one.
    Raises ``ValueError`` saying what is missing or wrong."""
    if not _of_scheme(url, SENTINEL_SCHEME):
        return None
    example = f"{SENTINEL_SCHEME}://127.0.0.1:26379,127.0.0.1:26380/mymaster/0"
    parts = urllib.parse.urlsplit(url)
    netloc, username, password = _userinfo(parts.netloc)
    sentinels = _hosts(netloc, url, example, "Sentinel", SENTINEL_PORT)
    path = [segment for segment in parts.path.split("/") if segment]
    if not path or len(path) > 2:
        raise ValueError(f"{redact_url(url)} must name the service (the master's name) and maybe a db: {example}")
    db = 0
    if len(path) == 2:
        if not path[1].isdigit():
            raise ValueError(f"{redact_url(url)}: the database must be a number, as in {example}")
        db = int(path[1])
    query = urllib.parse.parse_qs(parts.query)
    unknown = set(query) - {"sentinel_password"}
    if unknown:
        raise ValueError(
            f"{redact_url(url)}: unknown parameter {sorted(unknown)[0]!r}; the one taken is sentinel_password"
        )
    sentinel_password = query["sentinel_password"][-1] if "sentinel_password" in query else None
    return SentinelAddress(sentinels, urllib.parse.unquote(path[0]), db, username, password, sentinel_password)


#: The scheme of a Redis address that names nodes of a Redis Cluster.
CLUSTER_SCHEME = "redis+cluster"


class ClusterAddress(NamedTuple):
    """Where a Redis Cluster is: nodes to start from (the client learns the
    rest from them) and the password of its nodes."""

    nodes: Tuple[Tuple[str, int], ...]
    username: Optional[str]
    password: Optional[str]


def parse_cluster_url(url: str) -> Optional[ClusterAddress]:
    """``redis+cluster://[[user]:password@]host:port[,host:port...][/0]`` as a
    :class:`ClusterAddress`; ``None`` for an address of another scheme. A
    cluster has one database, 0. Raises ``ValueError`` saying what is wrong."""
    if not _of_scheme(url, CLUSTER_SCHEME):
        return None
    example = f"{CLUSTER_SCHEME}://127.0.0.1:7000,127.0.0.1:7001"
    parts = urllib.parse.urlsplit(url)
    netloc, username, password = _userinfo(parts.netloc)
    nodes = _hosts(netloc, url, example, "node", 6379)
    if parts.path.strip("/") not in ("", "0"):
        raise ValueError(f"{redact_url(url)}: a Redis Cluster has database 0 only; write it as {example}")
    if parts.query:
        raise ValueError(f"{redact_url(url)} takes no parameters; write it as {example}")
    return ClusterAddress(nodes, username, password)


def _of_scheme(url: str, scheme: str) -> bool:
    """Whether ``url`` is of ``scheme`` (``redis+...``); raises ``ValueError``
    for its TLS form, ``rediss+...``, which is not supported."""
    name = url.partition("://")[0].lower() if "://" in url else ""
    if name == "rediss" + scheme[len("redis") :]:
        raise ValueError(f"{name}:// (TLS) is not supported; use {scheme}:// on a network you trust")
    return name == scheme


def _userinfo(netloc: str) -> Tuple[str, Optional[str], Optional[str]]:
    """``netloc`` without its user and password, and those (unquoted)."""
    if "@" not in netloc:
        return netloc, None, None
    userinfo, _, netloc = netloc.rpartition("@")
    user, has_password, secret = userinfo.partition(":")
    return netloc, urllib.parse.unquote(user) or None, urllib.parse.unquote(secret) if has_password else None


def is_cluster_address(redis_broker: str) -> bool:
    """Whether ``redis_broker`` names a Redis Cluster (its keys then carry a
    hash tag: see :class:`~streamer_core.backends.redis.wire.Keys`)."""
    return _of_scheme(redis_broker, CLUSTER_SCHEME)


def _hosts(netloc: str, url: str, example: str, what: str, default_port: int) -> Tuple[Tuple[str, int], ...]:
    """The ``host[:port]`` list of a URL's ``netloc`` (``[IPv6]:port`` too),
    ``default_port`` where a host has none; at least one."""
    hosts = []
    for host_port in filter(None, netloc.split(",")):
        if host_port.startswith("["):  # [IPv6]:port
            host, _, after = host_port[1:].partition("]")
            port_text = after[1:] if after.startswith(":") else ""
        else:
            host, _, port_text = host_port.partition(":")
        if not host or (port_text and not port_text.isdigit()):
            raise ValueError(f"{redact_url(url)}: {host_port!r} is not host:port; write it as {example}")
        hosts.append((host, int(port_text) if port_text else default_port))
    if not hosts:
        raise ValueError(f"{redact_url(url)} names no {what}: write it as {example}")
    return tuple(hosts)


#: The schemes of the Redis URLs redis-py reads itself.
PLAIN_SCHEMES = ("redis", "rediss", "unix")
#: The forms of a Redis address, as messages name them.
ADDRESS_FORMS = (
    f"'host:port', a redis://, rediss:// or unix:// URL, a {SENTINEL_SCHEME}:// URL (Sentinels) "
    f"or a {CLUSTER_SCHEME}:// URL (a Redis Cluster)"
)


def check_address(redis_broker: str) -> None:
    """Raise ``ValueError`` saying how to write ``redis_broker`` when it is
    none of the forms :func:`connect` takes (nothing is connected)."""
    if parse_sentinel_url(redis_broker) is not None or parse_cluster_url(redis_broker) is not None:
        return
    if "://" in redis_broker:
        scheme = redis_broker.partition("://")[0].lower()
        if scheme not in PLAIN_SCHEMES:
            raise ValueError(f"must be {ADDRESS_FORMS}; {scheme}:// is none of them: got {redact_url(redis_broker)!r}")
        return
    host, _, port = redis_broker.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"must be {ADDRESS_FORMS}, got {redact_url(redis_broker)!r}")


def connect(redis_broker: str) -> Any:
    """A client for ``redis_broker``: ``"host:port"`` (service_streamer's
    form) or a URL, ``redis://[:password@]host:port/db``, ``rediss://`` for
    TLS, ``unix:///path``, or ``redis+sentinel://host:port,.../service/db``
    (:func:`parse_sentinel_url`), whose client asks the Sentinels for the
    service's master on every new connection, and so follows a failover, or
    ``redis+cluster://host:port,...`` (:func:`parse_cluster_url`): a
    ``RedisCluster``, which sends each command to the node of its key."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    # One immediate retry (a pooled connection that went stale); the callers'
    # own loops do the rest, so an unreachable server is reported in seconds.
    options: Dict[str, Any] = {
        "socket_connect_timeout": 2.0,
        "socket_timeout": 10.0,
        "health_check_interval": 15,
        "retry": Retry(NoBackoff(), 1),
    }
    packer = _large_value_packer()
    if packer is not None:
        options["command_packer"] = packer
    sentinel = parse_sentinel_url(redis_broker)
    if sentinel is not None:
        import redis.sentinel

        sentinels: Any = redis.sentinel  # untyped
        asking = {
            "socket_connect_timeout": 1.0,
            "socket_timeout": 2.0,
            "password": sentinel.sentinel_password,
            "retry": Retry(NoBackoff(), 0),  # the next Sentinel is the retry
        }
        manager = sentinels.Sentinel(list(sentinel.sentinels), sentinel_kwargs=asking)
        return manager.master_for(
            sentinel.service, db=sentinel.db, username=sentinel.username, password=sentinel.password, **options
        )
    cluster = parse_cluster_url(redis_broker)
    if cluster is not None:
        import redis.cluster

        clusters: Any = redis.cluster  # untyped
        options.pop("command_packer", None)  # not passed to a cluster's nodes
        options.pop("health_check_interval")
        return clusters.RedisCluster(
            startup_nodes=[clusters.ClusterNode(host, port) for host, port in cluster.nodes],
            username=cluster.username,
            password=cluster.password,
            **options,
        )
    check_address(redis_broker)
    if "://" not in redis_broker:
        host, _, port = redis_broker.rpartition(":")
        redis_broker = f"redis://[{host}]:{port}" if ":" in host else f"redis://{host}:{port}"
    return redis.Redis.from_url(redis_broker, **options)


# Arguments at least this long are handed to the socket as they are.
_LARGE_ARGUMENT = 64 * 1024


def _large_value_packer() -> Any:
    """A command packer for redis-py that hands large arguments (arrays'
    bytes) to the socket as they are: with hiredis installed, redis-py copies
    every argument into one buffer per command, an extra copy of each array.
    Other commands are packed by hiredis as redis-py would, in one pass over
    the arguments rather than two (a web process sends a script call of some
    800 arguments per batch of requests). ``None`` where redis-py lacks the
    pieces (it then packs as it always does)."""
    try:  # redis-py's internals, untyped: Any
        import redis._parsers.encoders as encoders
        import redis.connection as connection
        import redis.utils as utils
    except ImportError:  # pragma: no cover - another redis-py layout
        return None
    internals: Any = (encoders, connection, utils)
    encoding, packing, flags = internals
    if not getattr(flags, "HIREDIS_AVAILABLE", False) or not hasattr(packing, "PythonRespSerializer"):
        return None  # redis-py's own Python packer already passes large values through
    python = packing.PythonRespSerializer(6000, encoding.Encoder("utf-8", "strict", False).encode)
    fast = packing.HiredisRespSerializer()
    import hiredis

    pack_command = getattr(hiredis, "pack_command", None)
    data_error = getattr(packing, "DataError", TypeError)

    class _Packer:
        def pack(self, *args: Any) -> List[Any]:
            views = False
            for arg in args:
                kind = type(arg)
                if kind is bytes or kind is bytearray or kind is memoryview:
                    if len(arg) >= _LARGE_ARGUMENT:
                        chunks: List[Any] = python.pack(*args)
                        return chunks
                    views = views or kind is not bytes
            if views or pack_command is None:
                packed: List[Any] = fast.pack(*args)  # it makes bytes of the views first
                return packed
            # As redis-py's hiredis packer: a command name of several words
            # ("SCRIPT LOAD") is split into as many arguments.
            name = args[0]
            if isinstance(name, str):
                args = (*name.encode().split(), *args[1:])
            elif b" " in name:
                args = (*name.split(), *args[1:])
            try:
                return [pack_command(args)]
            except TypeError as exc:
                raise data_error(str(exc)) from exc

    return _Packer()


def on_node_of(conn: Any, key: str) -> Dict[str, Any]:
    """The keywords that send a keyless command (TIME, INFO) to the node
    that holds ``key`` on a Redis Cluster; none on a single server."""
    node_of = getattr(conn, "get_node_from_key", None)
    return {} if node_of is None else {"target_nodes": node_of(key)}


def server_time_ms(conn: Any, key: str) -> float:
    """The Redis server's clock now, in ms: that of the node holding ``key``
    on a Cluster, the clock its scripts read."""
    seconds, micros = conn.time(**on_node_of(conn, key))
    return float(seconds) * 1000 + float(micros) / 1000


def broker_problem(exc: BaseException, redis_broker: str = "") -> str:
    """What went wrong talking to Redis at ``redis_broker`` (when given), in
    words for a log line or an error: a refused password is not an
    unreachable server, and a master behind Sentinels that does not answer
    may be failing over."""
    import redis

    if is_auth_error(exc):
        return f"Redis refused the credentials ({exc}): check the password (and user) in the Redis URL"
    if isinstance(exc, redis.ResponseError):  # it answered, with an error: out of memory, read-only, ...
        return f"Redis refused the command ({exc})"
    import redis.sentinel

    if isinstance(exc, redis.sentinel.MasterNotFoundError):
        # Its message holds the repr of a whole client: say it in words.
        service = str(exc).partition("No master found for ")[2].partition(" :")[0] or "the service"
        return (
            f"no Sentinel names a master for {service} now: a failover may be under way, and calls are served "
            "again once the Sentinels promote a replica; if this lasts, check that the Sentinels answer at the "
            "addresses in the URL, take its sentinel_password (if they have one) and monitor a service of that name"
        )
    if _of_scheme(redis_broker, SENTINEL_SCHEME):
        return (
            f"the Redis master cannot be reached ({exc}): if it has just failed, a failover may be under way, "
            "and calls are served again once the Sentinels promote a replica"
        )
    return f"Redis cannot be reached ({exc})"


def is_auth_error(exc: BaseException) -> bool:
    """Whether Redis refused this client's password (or wanted one)."""
    import redis

    return isinstance(exc, redis.AuthenticationError) or str(exc).startswith(("NOAUTH", "WRONGPASS"))


def broker_errors() -> Tuple[Type[BaseException], ...]:
    import redis

    return (redis.ConnectionError, redis.TimeoutError, ConnectionError, OSError)


def redact_url(url: str) -> str:
    """``url`` with its password (and user) hidden, for log lines."""
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest:
        return f"{scheme}://***@{rest.rpartition('@')[2]}"
    return url


def setup_refused(redis_broker: str, exc: BaseException) -> ValueError:
    """The error for a Redis that answers this client's connection set-up
    with an error (a database number it does not have): a setting to fix,
    not a fault to wait out. The URL's password is not shown."""
    return ValueError(
        f"Redis refused this client at {redact_url(redis_broker)} ({exc}): check the database number and the "
        "user in the Redis URL"
    )


def wait_for_broker(redis_broker: str, stopping: threading.Event, log_every: float = 30.0) -> bool:
    """Block until ``redis_broker`` answers PING (return True) or ``stopping``
    is set (False), logging one clear line when it does not answer and again
    every ``log_every`` seconds, rather than a traceback per attempt. Raises
    ``ValueError`` when Redis refuses the client's set-up (see :func:`setup_refused`)."""
    import redis

    conn = connect(redis_broker)
    failing_since: Optional[float] = None
    next_log = 0.0
    try:
        while not stopping.is_set():
            try:
                conn.ping()
                if failing_since is not None:
                    logger.warning("Redis at %s answers now; starting workers", redact_url(redis_broker))
                return True
            except broker_errors() as exc:
                now = time.monotonic()
                if failing_since is None:
                    failing_since = now
                if now >= next_log:
                    next_log = now + log_every
                    problem = broker_problem(exc) if is_auth_error(exc) else f"Redis does not answer ({exc})"
                    logger.error("%s at %s; retrying (Ctrl-C to stop)", problem, redact_url(redis_broker))
                stopping.wait(min(MAX_BACKOFF_S, 0.25 + (now - failing_since) / 4))
            except redis.ResponseError as exc:
                raise setup_refused(redis_broker, exc) from exc
        return False
    finally:
        conn.close()


class LoopErrors:
    """For a thread whose loop must keep running: logs an unexpected error
    with its traceback the first time, and the same error again at most once
    a minute while it repeats, so that a lasting fault is seen without
    flooding the log."""

    def __init__(self, what: str, every_s: float = 60.0) -> None:
        self._what = what
        self._every_s = every_s
        self._last: Dict[str, float] = {}

    def log(self, exc: BaseException) -> None:
        key = f"{type(exc).__name__}: {exc}"[:200]
        now = time.monotonic()
        if now - self._last.get(key, float("-inf")) < self._every_s:
            return
        if len(self._last) > 100:
            self._last.clear()
        self._last[key] = now
        logger.error("error in %s; it keeps running", self._what, exc_info=exc)


class ServerIdentity:
    """Which Redis server a web process sent its requests to, by the
    server's run id (it changes when the server restarts, and a restarted
    server has lost them). A user that may not run INFO (an ACL of
    ``-@dangerous``) cannot tell: said once in the log, and its restarts go
    unnoticed."""

    def __init__(self) -> None:
        self.run_id: Optional[str] = None
        self._refused = False

    def changed(self, conn: Any, key: str = "") -> bool:
        """Ask the server (on a Cluster, the node holding ``key``) its run
        id; whether it is another server than the one asked before (the
        first answer is no change)."""
        run_id = self._ask(conn, key)
        if run_id is None or run_id == self.run_id:
            return False
        first = self.run_id is None
        self.run_id = run_id
        return not first

    def _ask(self, conn: Any, key: str) -> Optional[str]:
        import redis

        if self._refused:
            return None
        try:
            return str(conn.info("server", **on_node_of(conn, key))["run_id"])
        except redis.ResponseError as exc:
            if not isinstance(exc, redis.exceptions.NoPermissionError) and "unknown command" not in str(exc).lower():
                raise
            self._refused = True
            logger.warning(
                "Redis refuses INFO to this client (%s): a restart of Redis that loses the requests in flight "
                "will not be noticed, and their calls time out; allow INFO (+info) to have them sent again",
                exc,
            )
            return None
