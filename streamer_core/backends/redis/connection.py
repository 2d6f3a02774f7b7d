"""Connecting to Redis (at a :class:`~streamer_core.options.redis_address.RedisAddress`),
the errors that mean "Redis is not there", and waiting for it to answer."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Dict, List, Optional, Tuple, Type

from ... import shortcuts
from ...errors import ConfigurationError
from ...options.redis_address import AddressLike, RedisAddress

__all__ = [
    "on_node_of",
    "server_time_ms",
    "ServerIdentity",
    "connect",
    "refuses_setup",
    "setup_refused",
    "wait_for_broker",
    "broker_errors",
    "broker_problem",
    "LoopErrors",
    "OutageLog",
    "MAX_BACKOFF_S",
]

logger = logging.getLogger("streamer_core.redis")

#: The longest pause between two tries while Redis does not answer, seconds.
MAX_BACKOFF_S = 2.0


#: Seconds one command of a question that a person or a scraper waits for
#: (``/metrics``, the status commands) may take, no retry: a Redis that has
#: stopped answering (frozen, a network cut) is then said in about a
#: second, where the serving connections wait ten, and once more.
ASK_TIMEOUT_S = 1.0


def connect(address: RedisAddress, asking: bool = False) -> Any:
    """A client for ``address``: one server; Sentinels, whose client asks
    them for the service's master on every new connection, and so follows a
    failover; or a Redis Cluster, a ``RedisCluster`` that sends each command
    to the node of its key. Nothing is connected until a command is sent.
    ``asking``: for questions someone waits on (:data:`ASK_TIMEOUT_S`)."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    # One immediate retry (a pooled connection that went stale); the callers'
    # own loops do the rest, so an unreachable server is reported in seconds.
    options: Dict[str, Any] = {
        "socket_connect_timeout": ASK_TIMEOUT_S if asking else 2.0,
        "socket_timeout": ASK_TIMEOUT_S if asking else 10.0,
        "health_check_interval": 15,
        "retry": Retry(NoBackoff(), 0 if asking else 1),
    }
    packer = _large_value_packer() if shortcuts.allowed("redis-packing") else None
    if packer is not None:
        options["command_packer"] = packer
    if address.is_sentinel:
        import redis.sentinel

        sentinels: Any = redis.sentinel  # untyped
        to_sentinels = {
            "socket_connect_timeout": 1.0,
            "socket_timeout": 2.0,
            "password": address.sentinel_password,
            "retry": Retry(NoBackoff(), 0),  # the next Sentinel is the retry
        }
        manager = sentinels.Sentinel(list(address.hosts), sentinel_kwargs=to_sentinels)
        return manager.master_for(
            address.service, db=address.db, username=address.username, password=address.password, **options
        )
    if address.is_cluster:
        import redis.cluster

        clusters: Any = redis.cluster  # untyped
        options.pop("command_packer", None)  # not passed to a cluster's nodes
        options.pop("health_check_interval")
        return clusters.RedisCluster(
            startup_nodes=[clusters.ClusterNode(host, port) for host, port in address.hosts],
            username=address.username,
            password=address.password,
            **options,
        )
    return redis.Redis.from_url(address.url, **options)


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


def broker_problem(exc: BaseException, address: Optional[RedisAddress] = None) -> str:
    """What went wrong talking to Redis at ``address`` (when given), in
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
    if address is not None and address.is_sentinel:
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


def setup_refused(address: RedisAddress, exc: BaseException) -> ConfigurationError:
    """The error for a Redis that answers this client's connection set-up
    with an error (a database number it does not have, credentials it
    refuses): a setting to fix, not a fault to wait out, where a process or
    a command starts. The URL's password is not shown."""
    if is_auth_error(exc):
        fix = "check the password (and user) in the Redis URL"
    else:
        fix = "check the database number and the user in the Redis URL"
    return ConfigurationError(f"Redis refused this client at {address.redacted} ({exc}): {fix}")


def refuses_setup(exc: BaseException) -> bool:
    """Whether ``exc``, raised by a client's first command, is Redis refusing
    its set-up (see :func:`setup_refused`) rather than not answering."""
    import redis

    return is_auth_error(exc) or isinstance(exc, redis.ResponseError)


def wait_for_broker(redis_broker: AddressLike, stopping: threading.Event, log_every: float = 30.0) -> bool:
    """Block until ``redis_broker`` answers PING (return True) or ``stopping``
    is set (False), logging one clear line when it does not answer and again
    every ``log_every`` seconds, rather than a traceback per attempt. Raises
    :class:`~streamer_core.errors.ConfigurationError` (a ``ValueError``)
    when Redis refuses the client's set-up (see :func:`setup_refused`)."""
    address = RedisAddress.of(redis_broker)

    conn = connect(address)
    failing_since: Optional[float] = None
    next_log = 0.0
    try:
        while not stopping.is_set():
            try:
                conn.ping()
                if failing_since is not None:
                    logger.warning("Redis at %s answers now; starting workers", address.redacted)
                return True
            except Exception as exc:
                if refuses_setup(exc):
                    raise setup_refused(address, exc) from exc
                if not isinstance(exc, broker_errors()):
                    raise
                now = time.monotonic()
                if failing_since is None:
                    failing_since = now
                if now >= next_log:
                    next_log = now + log_every
                    logger.error("Redis does not answer (%s) at %s; retrying (Ctrl-C to stop)", exc, address.redacted)
                stopping.wait(min(MAX_BACKOFF_S, 0.25 + (now - failing_since) / 4))
        return False
    finally:
        conn.close()


class OutageLog:
    """Says that a kind of request to Redis fails once an outage, not at
    each try: a warning at the first failure, and one when a try succeeds
    again, with how long it lasted and how many tries failed meanwhile.
    While Redis is down every request fails the same way, each retried,
    and a line for each try would bury the rest of the log (the calls
    refused are the web layer's 503s, logged at their own rate)."""

    def __init__(self, what: str, again: str) -> None:
        self._what = what  # "streamer:x: could not send to Redis"
        self._again = again  # "streamer:x: sending to Redis again"
        self._lock = threading.Lock()
        self._since: Optional[float] = None
        self._failed = 0

    def failed(self, problem: str) -> None:
        """A try failed, for ``problem`` (:func:`broker_problem`'s words)."""
        with self._lock:
            self._failed += 1
            if self._since is not None:
                return
            self._since = time.monotonic()
        logger.warning("%s: %s; retrying (said once, until a try succeeds)", self._what, problem)

    def succeeded(self) -> None:
        """A try succeeded: the end of an outage, if one was under way."""
        if self._since is None:  # the usual case, without the lock
            return
        with self._lock:
            since, failed = self._since, self._failed
            self._since, self._failed = None, 0
        if since is not None:
            lasted = time.monotonic() - since
            logger.warning("%s after %.1f s; %d tries failed meanwhile", self._again, lasted, failed)


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
