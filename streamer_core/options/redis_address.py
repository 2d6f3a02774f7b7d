"""Where Redis is: an address as a user writes it, parsed once into a
:class:`RedisAddress`.

Every place that takes a Redis address (``RedisStreamer``, ``RedisWorker``,
the worker commands, the Flask and Django settings) takes one of these
forms, checked here and nowhere else, without importing redis:

- ``host:port``, service_streamer's form (:data:`DEFAULT_REDIS`);
- ``redis://[[user]:password@]host:port/db``, ``rediss://`` for TLS,
  ``unix:///path/to/redis.sock``: one server, as redis-py reads them;
- ``redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/service[/db][?sentinel_password=...]``:
  the Sentinels watching ``service`` (the password is the master's,
  ``sentinel_password`` the Sentinels' own);
- ``redis+cluster://[[user]:password@]host:port[,host:port...]``: nodes of a
  Redis Cluster to start from.

A wrong one raises ``ValueError`` saying how to write it; the password is
never in a message (:attr:`RedisAddress.redacted`).
"""

from __future__ import annotations

import re
import urllib.parse
from typing import NamedTuple, Optional, Tuple, Union

__all__ = [
    "ADDRESS_FORMS",
    "AddressLike",
    "CLUSTER_SCHEME",
    "DEFAULT_REDIS",
    "SENTINEL_SCHEME",
    "RedisAddress",
    "redact_url",
]

#: The Redis a streamer or worker uses when given none: service_streamer's default.
DEFAULT_REDIS = "localhost:6379"
#: The scheme of a Redis address that names Sentinels and a service.
SENTINEL_SCHEME = "redis+sentinel"
#: The scheme of a Redis address that names nodes of a Redis Cluster.
CLUSTER_SCHEME = "redis+cluster"
#: The schemes of the one-server URLs redis-py reads itself.
SERVER_SCHEMES = ("redis", "rediss", "unix")
#: Sentinel's port when the URL gives none.
SENTINEL_PORT = 26379
#: The forms of a Redis address, as messages name them.
ADDRESS_FORMS = (
    f"'host:port', a redis://, rediss:// or unix:// URL, a {SENTINEL_SCHEME}:// URL (Sentinels) "
    f"or a {CLUSTER_SCHEME}:// URL (a Redis Cluster)"
)

Hosts = Tuple[Tuple[str, int], ...]


class RedisAddress(NamedTuple):
    """A Redis address, parsed: made by :meth:`parse`.

    ``kind`` is ``"server"``, ``"sentinel"`` or ``"cluster"``; ``url`` is
    what was written (``redis://host:port`` for ``host:port``), what redis-py
    is given for a server; ``hosts`` the server, the Sentinels or the
    cluster's first nodes (none for a Unix socket); ``service`` the name the
    Sentinels watch; ``sentinel_password`` theirs, ``password`` the
    server's (the master's and its replicas' behind Sentinels)."""

    kind: str
    url: str
    hosts: Hosts
    db: int
    username: Optional[str]
    password: Optional[str]
    service: str = ""
    sentinel_password: Optional[str] = None

    @classmethod
    def parse(cls, text: str) -> RedisAddress:
        """``text`` as an address; ``ValueError`` saying how to write it."""
        if not isinstance(text, str) or not text:
            raise ValueError(f"must be {ADDRESS_FORMS}, got {text!r}")
        scheme = text.partition("://")[0].lower() if "://" in text else ""
        if scheme in (f"rediss+{SENTINEL_SCHEME[6:]}", f"rediss+{CLUSTER_SCHEME[6:]}"):
            plain = scheme.replace("rediss", "redis")
            raise ValueError(f"{scheme}:// (TLS) is not supported; use {plain}:// on a network you trust")
        if scheme == SENTINEL_SCHEME:
            return _sentinel(text)
        if scheme == CLUSTER_SCHEME:
            return _cluster(text)
        if scheme:
            if scheme not in SERVER_SCHEMES:
                raise ValueError(f"must be {ADDRESS_FORMS}; {scheme}:// is none of them: got {redact_url(text)!r}")
            return _server(text)
        host, _, port = text.rpartition(":")
        host = host[1:-1] if host.startswith("[") and host.endswith("]") else host  # [IPv6]:port
        if not host or not port.isdigit():
            raise ValueError(f"must be {ADDRESS_FORMS}, got {redact_url(text)!r}")
        return _server(f"redis://[{host}]:{port}" if ":" in host else f"redis://{host}:{port}")

    @classmethod
    def of(cls, value: AddressLike) -> RedisAddress:
        """``value`` itself when it is an address already, else parsed."""
        return value if isinstance(value, RedisAddress) else cls.parse(value)

    @property
    def redacted(self) -> str:
        """The address as written, its password (and user) hidden: for messages and logs."""
        return redact_url(self.url)

    @property
    def is_cluster(self) -> bool:
        """Whether it names a Redis Cluster (a model's keys then carry a hash tag)."""
        return self.kind == "cluster"

    @property
    def is_sentinel(self) -> bool:
        """Whether it names Sentinels (the master they name may fail over)."""
        return self.kind == "sentinel"

    def __str__(self) -> str:
        return self.redacted

    def __repr__(self) -> str:  # no password in a repr either: settings and specs are printed
        return f"RedisAddress({self.redacted!r})"


#: What every parameter that takes a Redis address accepts: its text, or the address parsed.
AddressLike = Union[str, RedisAddress]


def redact_url(url: str) -> str:
    """``url`` with its password (and user) hidden, and the value of any
    parameter whose name says password (``sentinel_password``), for log lines."""
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest:
        rest = f"***@{rest.rpartition('@')[2]}"
    rest = _SECRET_PARAMETER.sub(r"\1***", rest)
    return f"{scheme}{sep}{rest}"


# A query parameter that carries a password: its name and '=', then its value.
_SECRET_PARAMETER = re.compile(r"([?&][^=&]*password[^=&]*=)[^&#]*", re.IGNORECASE)


def _server(url: str) -> RedisAddress:
    """One server, as redis-py reads ``url``: its host, port and db, for messages."""
    parts = urllib.parse.urlsplit(url)
    _, username, password = _userinfo(parts.netloc)
    if parts.scheme.lower() == "unix":
        hosts: Hosts = ()
    else:
        try:
            port = parts.port or 6379
        except ValueError:
            raise ValueError(f"{redact_url(url)}: the port must be a number, as in redis://127.0.0.1:6379/0") from None
        hosts = ((parts.hostname or "localhost", port),)
    db_text = parts.path.strip("/") if parts.scheme.lower() != "unix" else ""
    db_text = urllib.parse.parse_qs(parts.query).get("db", [db_text])[-1] or "0"
    if not db_text.isdigit():
        raise ValueError(f"{redact_url(url)}: the database must be a number, as in redis://127.0.0.1:6379/0")
    return RedisAddress("server", url, hosts, int(db_text), username, password)


def _sentinel(url: str) -> RedisAddress:
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
    service = urllib.parse.unquote(path[0])
    return RedisAddress("sentinel", url, sentinels, db, username, password, service, sentinel_password)


def _cluster(url: str) -> RedisAddress:
    """A cluster has one database, 0."""
    example = f"{CLUSTER_SCHEME}://127.0.0.1:7000,127.0.0.1:7001"
    parts = urllib.parse.urlsplit(url)
    netloc, username, password = _userinfo(parts.netloc)
    nodes = _hosts(netloc, url, example, "node", 6379)
    if parts.path.strip("/") not in ("", "0"):
        raise ValueError(f"{redact_url(url)}: a Redis Cluster has database 0 only; write it as {example}")
    if parts.query:
        raise ValueError(f"{redact_url(url)} takes no parameters; write it as {example}")
    return RedisAddress("cluster", url, nodes, 0, username, password)


def _userinfo(netloc: str) -> Tuple[str, Optional[str], Optional[str]]:
    """``netloc`` without its user and password, and those (unquoted)."""
    if "@" not in netloc:
        return netloc, None, None
    userinfo, _, netloc = netloc.rpartition("@")
    user, has_password, secret = userinfo.partition(":")
    return netloc, urllib.parse.unquote(user) or None, urllib.parse.unquote(secret) if has_password else None


def _hosts(netloc: str, url: str, example: str, what: str, default_port: int) -> Hosts:
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
