"""Everything the Redis backend keeps in Redis: the keys of a prefix, the
fields of each entry, and what happens to an entry that does not parse.

Keys, for a prefix ``P`` (``streamer`` alone when the prefix is empty)::

    streamer:P:requests          stream; consumer group "workers": priority level 1, or the only one
    streamer:P:requests:<n>      stream; consumer group "workers": priority level n (2, 3, ...),
                                 where the model has priority levels (see Keys.request_stream)
    streamer:P:results:<client>  stream per web process, expires when unread
    streamer:P:workers           sorted set: worker name -> its last beat (server ms)
    streamer:P:worker-info       hash: worker name -> JSON {"host", "pid", "device", "levels", "batch_size"}
    streamer:P:dead              stream, capped: entries that did not parse

A request entry (written by :func:`request_fields`, read by :func:`parse_request`):

    v   wire version, "1" (entries of 0.1.0 have none: same fields otherwise)
    c   the web process's client id (names its results stream)
    i   the request id: random, so that nobody can answer a call without it
    t   the call's remaining timeout when sent, ms
    k   the codec of the payload ("msgpack", "pickle")
    p   the payload
    b0, b1, ...  the payload's out-of-band buffers (raw bytes of large arrays)
    w   optional: the input's cost, by the web side's ``item_cost``
    tp  optional: the W3C ``traceparent`` of the span the call was made in,
        when the web side traces (a worker that does not know it ignores it);
        flags 00 for a span the sampler left out (its batch makes no span for it)

A result entry holds every answer of one batch for one web process
(written by :func:`result_entry`, read by :func:`parse_results`)::

    v   wire version, "1"
    i   the request ids, comma-separated
    ok  one character per answer: "1", its payload is the output; "0", an error
    k   the codec of the outputs (errors are always msgpack: plain data)
    p0, p1, ...        the answers' payloads
    b0_0, b0_1, ...    the out-of-band buffers of answer 0, and so on

A web process of 0.1.0 (its requests have no ``v``) is answered as it
expects, one entry per answer: ``i``, ``ok``, ``k``, ``p``
(:func:`legacy_result_entry`).

Anyone with access to the Redis server can write anything under these keys.
So parsing never trusts a field: an entry that does not parse raises
:class:`MalformedEntry`, and the reader moves it to the dead-letter stream
(:mod:`.damage`), acknowledges and deletes it, and reads on.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import re
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

from ...options.config import MAX_SECONDS
from .connection import server_time_ms

__all__ = [
    "Keys",
    "LoadingWorker",
    "loading_workers",
    "next_id",
    "by_level",
    "GROUP",
    "WIRE_VERSION",
    "MalformedEntry",
    "Request",
    "Result",
    "Answer",
    "new_client_id",
    "new_request_id",
    "request_fields",
    "request_arguments",
    "ADD_REQUESTS_SCRIPT",
    "ADD_PACKED_REQUESTS_SCRIPT",
    "packed_request_arguments",
    "parse_request",
    "result_entry",
    "legacy_result_entry",
    "parse_results",
]

logger = logging.getLogger("streamer_core.redis")

#: The consumer group of the workers on the requests stream.
GROUP = "workers"
#: The version of the entry format this code writes, and the newest it reads.
WIRE_VERSION = 1
# Result streams of web processes that stopped reading expire after this long.
RESULTS_TTL_S = 300
RESULTS_MAXLEN = 100_000
# Workers beat into the workers set at least this often (seconds); a worker
# whose last beat is older than PRESENCE_MS is taken for dead.
BEAT_S = 1.0
PRESENCE_MS = 3000
PRESENCE_TTL_MS = 60_000
# The longest timeout a request may carry, ms: the longest any streamer takes.
_MAX_TIMEOUT_MS = int(MAX_SECONDS * 1000)
# Client and request ids: letters, digits, '-' and '_'. They become part of a
# key name (the results stream), so nothing else is let through.
_TOKEN = re.compile(rb"[0-9A-Za-z_-]{1,64}\Z")
_CODEC_NAME = re.compile(rb"[a-z0-9_-]{1,32}\Z")
_BUFFER_FIELD = re.compile(rb"b(0|[1-9][0-9]{0,5})\Z")
_RESULT_BUFFER_FIELD = re.compile(rb"b(0|[1-9][0-9]{0,5})_(0|[1-9][0-9]{0,5})\Z")

# The presence scripts first delete the presence set if it holds another Redis type
# (something else wrote there): presence must never stop for good.
_FIX_ZSET = """
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'zset' and kind ~= 'none' then redis.call('DEL', KEYS[1]) end
local t = redis.call('TIME')
local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""
# Record this worker's beat, by the server's clock.
BEAT_SCRIPT = (
    _FIX_ZSET
    + """
redis.call('ZADD', KEYS[1], ms, ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return ms
"""
)
# Forget workers silent for ten times the window ARGV[1] (ms), and members
# dated in the future (no worker writes those).
_FORGET_SILENT = """
local window = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ms - 10 * window)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '(' .. (ms + window), '+inf')
"""
# How many workers beat within the last ARGV[1] ms, by the server's clock.
LIVE_WORKERS_SCRIPT = (
    _FIX_ZSET
    + _FORGET_SILENT
    + """
return redis.call('ZCOUNT', KEYS[1], ms - window, '+inf')
"""
)
# What each of those workers wrote of itself (the hash KEYS[2]: JSON of its
# host, pid, device, the priority levels it reads), one reply per live
# worker, nil where it wrote nothing (or KEYS[2] holds another type): the
# live workers by device, and the levels they read, in one round trip.
LIVE_WORKER_INFO_SCRIPT = (
    _FIX_ZSET
    + _FORGET_SILENT
    + """
local live = redis.call('ZRANGEBYSCORE', KEYS[1], ms - window, '+inf')
if #live == 0 or redis.call('TYPE', KEYS[2])['ok'] ~= 'hash' then
  local none = {}
  for i = 1, #live do none[i] = false end
  return none
end
return redis.call('HMGET', KEYS[2], unpack(live))
"""
)
# Add request entries to the stream KEYS[1] in one command, so that sending
# many costs one reply to parse, not one each. ARGV holds, for each entry,
# how many field and value arguments it has, then those (request_arguments);
# the reply is the entries' ids, in order. The fallback of
# ADD_PACKED_REQUESTS_SCRIPT, for a server whose Lua lacks cmsgpack.
ADD_REQUESTS_SCRIPT = """
local ids, i = {}, 1
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  ids[#ids + 1] = redis.call('XADD', KEYS[1], '*', unpack(ARGV, i + 1, i + n))
  i = i + n + 1
end
return ids
"""
# The same entries, field for field, as request_fields makes them, from
# fewer and cheaper arguments (packed_request_arguments): what all of a
# send's entries share once (ARGV[2..4]: version, client id, codec), and one
# MessagePack array of five strings per entry (ARGV[1]: request id, timeout
# in ms, payload, cost or '', traceparent or ''). Packing 64 requests' 832
# arguments, and the Python objects behind them, took the web process more
# time than Redis took to run the script. An entry with a traceparent (the
# web side traces) is built field by field; the others as they always were.
ADD_PACKED_REQUESTS_SCRIPT = """
local each, ids = cmsgpack.unpack(ARGV[1]), {}
local stream, v, c, k = KEYS[1], ARGV[2], ARGV[3], ARGV[4]
for n = 1, #each, 5 do
  local w, tp = each[n + 3], each[n + 4]
  if tp ~= '' then
    local fields = {'v', v, 'c', c, 'i', each[n], 't', each[n + 1], 'k', k, 'p', each[n + 2]}
    if w ~= '' then fields[#fields + 1], fields[#fields + 2] = 'w', w end
    fields[#fields + 1], fields[#fields + 2] = 'tp', tp
    ids[#ids + 1] = redis.call('XADD', stream, '*', unpack(fields))
  elseif w == '' then
    ids[#ids + 1] = redis.call('XADD', stream, '*', 'v', v, 'c', c, 'i', each[n], 't', each[n + 1], 'k', k,
      'p', each[n + 2])
  else
    ids[#ids + 1] = redis.call('XADD', stream, '*', 'v', v, 'c', c, 'i', each[n], 't', each[n + 1], 'k', k,
      'p', each[n + 2], 'w', w)
  end
end
return ids
"""


class Keys:
    """The Redis keys of one prefix; ``prefix`` keeps models apart.

    On a Redis Cluster (``hash_tag``) the prefix is a hash tag,
    ``streamer:{<prefix>}:...``, so that every key of one model is in one
    hash slot, on one node: the scripts and transactions that touch several
    of them work, and models spread over the nodes by their prefixes."""

    def __init__(self, prefix: str, hash_tag: bool = False) -> None:
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, got {prefix!r}")
        if hash_tag:
            self.namespace = f"streamer:{{{prefix}}}" if prefix else "streamer:{streamer}"
        else:
            self.namespace = f"streamer:{prefix}" if prefix else "streamer"
        self.requests = f"{self.namespace}:requests"
        self.workers = f"{self.namespace}:workers"  # a sorted set: worker -> its last beat, server ms
        # A sorted set of the workers loading their model: worker -> its last beat, server ms.
        self.loading = f"{self.namespace}:loading"
        # A hash: worker -> JSON of its host, pid, device (and, while loading, loading_since: server ms).
        self.worker_info = f"{self.namespace}:worker-info"
        self.dead = f"{self.namespace}:dead"

    def results(self, client_id: str) -> str:
        return f"{self.namespace}:results:{client_id}"

    def request_stream(self, level: int) -> str:
        """The requests stream of priority ``level`` (0 the highest, as
        :mod:`streamer_core.batching.levels` counts them): :attr:`requests` for the
        highest, so that a model of one level keeps its one stream and
        its wire format; ``<requests>:<level + 1>`` for the others. Every
        level's stream has the workers' group, and workers read them
        highest first."""
        return self.requests if level == 0 else f"{self.requests}:{level + 1}"

    def request_streams(self, levels: int) -> List[str]:
        """The requests streams of ``levels`` priority levels, the highest first."""
        return [self.request_stream(level) for level in range(levels)]


class LoadingWorker(NamedTuple):
    """A worker that announced itself while it loads its model."""

    name: str
    info: Dict[str, Any]  # its host, pid, device, as it wrote them (read defensively)
    seconds: float  # loading so far, by the Redis server's clock


def loading_workers(conn: Any, keys: Keys) -> List[LoadingWorker]:
    """The workers of ``keys`` loading their model now (each beat within the
    last ``PRESENCE_MS``), the longest-loading first. Anyone with access to
    Redis may have written anything there: what does not parse is left out."""
    if not int(conn.eval(LIVE_WORKERS_SCRIPT, 1, keys.loading, PRESENCE_MS)):
        return []
    now_ms = server_time_ms(conn, keys.loading)
    members = conn.zrangebyscore(keys.loading, now_ms - PRESENCE_MS, "+inf")
    infos = conn.hmget(keys.worker_info, members) if members and conn.type(keys.worker_info) == b"hash" else []
    found = []
    for member, raw in itertools.zip_longest(members, infos):
        try:
            info = json.loads(raw) if raw is not None else {}
        except ValueError:
            info = {}
        if not isinstance(info, dict):
            info = {}
        since = info.get("loading_since")
        loading_s = max(0.0, (now_ms - since) / 1000) if isinstance(since, (int, float)) else 0.0
        name = member.decode("utf-8", "replace") if isinstance(member, bytes) else str(member)
        found.append(LoadingWorker(name, info, loading_s))
    return sorted(found, key=lambda worker: -worker.seconds)


class MalformedEntry(ValueError):
    """An entry that does not parse; the message says why, never what it held."""


def next_id(entry_id: bytes) -> bytes:
    """The stream id just after ``entry_id``."""
    ms, _, seq = entry_id.partition(b"-")
    return b"%s-%d" % (ms, int(seq) + 1)


def by_level(pairs: Iterable[Tuple[int, bytes]]) -> Dict[int, List[bytes]]:
    """Entry ids grouped by the level of their stream, in order."""
    grouped: Dict[int, List[bytes]] = {}
    for level, entry_id in pairs:
        grouped.setdefault(level, []).append(entry_id)
    return grouped


def new_client_id() -> str:
    """A web process's id: 128 random bits, as hex."""
    return os.urandom(16).hex()


def new_request_id() -> bytes:
    """A request id: 64 random bits, as hex, so a result cannot be forged
    for a call without reading its request."""
    return os.urandom(8).hex().encode()


# -- requests --------------------------------------------------------------------------


class Request(NamedTuple):
    """A request entry, parsed."""

    entry_id: bytes
    client: str
    item_id: bytes
    timeout_ms: int
    codec: str
    payload: bytes
    buffers: Tuple[bytes, ...]
    version: int
    cost: Optional[float] = None  # by the web side's item_cost, when it has one
    trace: Optional[bytes] = None  # the caller's traceparent, when the web side traces (unchecked)
    level: int = 0  # the priority level of the stream it was read from (0 the highest): not a field

    def created_ms(self) -> int:
        """When Redis added the entry, by the server's clock (its id's first part)."""
        return int(self.entry_id.split(b"-", 1)[0])


def request_fields(
    client: str,
    item_id: bytes,
    timeout_ms: int,
    codec: str,
    payload: bytes,
    buffers: Sequence[Any] = (),
    cost: Optional[float] = None,
    trace: Optional[str] = None,
) -> Dict[str, Any]:
    """The fields of a request entry. ``cost`` (field ``w``, optional: a
    worker that does not know it ignores it) is the input's cost by the web
    side's ``item_cost``, for workers that shape batches by cost; ``trace``
    (field ``tp``, optional too) the ``traceparent`` of the call's span."""
    fields: Dict[str, Any] = {"v": WIRE_VERSION, "c": client, "i": item_id, "t": timeout_ms, "k": codec, "p": payload}
    if cost is not None:
        fields["w"] = repr(float(cost))
    if trace is not None:
        fields["tp"] = trace
    for n, buffer in enumerate(buffers):
        fields[f"b{n}"] = buffer
    return fields


#: One request to send: request id, timeout in ms, payload, cost and traceparent (or ``None``).
PackedRequest = Tuple[bytes, int, bytes, Optional[float], Optional[str]]


def packed_request_arguments(client: str, codec: str, requests: Sequence[PackedRequest]) -> List[Any]:
    """The arguments of :data:`ADD_PACKED_REQUESTS_SCRIPT` adding these
    requests (without buffers): the entries it writes are those
    :func:`request_fields` makes."""
    import msgpack  # the redis extra's, as the codecs'

    each: List[bytes] = []
    for item_id, timeout_ms, payload, cost, trace in requests:
        weight = b"" if cost is None else repr(float(cost)).encode()
        each += (item_id, b"%d" % timeout_ms, payload, weight, b"" if trace is None else trace.encode())
    # Raw strings, not bin: the cmsgpack of Redis's Lua predates bin.
    return [msgpack.packb(each, use_bin_type=False), WIRE_VERSION, client, codec]


def request_arguments(entries: Sequence[Dict[str, Any]]) -> List[Any]:
    """The arguments of :data:`ADD_REQUESTS_SCRIPT` adding these entries
    (each as :func:`request_fields` makes it)."""
    arguments: List[Any] = []
    for fields in entries:
        arguments.append(2 * len(fields))
        for pair in fields.items():
            arguments.extend(pair)
    return arguments


def parse_request(entry_id: Any, fields: Any, level: int = 0) -> Request:
    """A request entry of the stream of priority ``level`` as
    :class:`Request`; :class:`MalformedEntry` if it is not one."""
    if not isinstance(entry_id, bytes) or not isinstance(fields, dict):
        raise MalformedEntry("not a stream entry")
    client = _token(fields, b"c")
    item_id = _token(fields, b"i")
    timeout_ms = _int(fields, b"t", 1, _MAX_TIMEOUT_MS)
    return Request(
        entry_id, client.decode(), item_id, timeout_ms, _codec_name(fields), _bytes(fields, b"p"),
        _buffers(fields), _version(fields), _cost(fields), _trace(fields), level,
    )  # fmt: skip


# -- results -----------------------------------------------------------------------------


class Result(NamedTuple):
    """One answer, parsed. ``ok``: whether ``payload`` is the output (or an error)."""

    item_id: bytes
    ok: bool
    codec: str
    payload: bytes
    buffers: Tuple[bytes, ...]
    version: int


#: One answer to write: request id, whether it is an output, its payload and buffers.
Answer = Tuple[bytes, bool, bytes, Sequence[Any]]


def result_entry(answers: Sequence[Answer], codec: str) -> Dict[Any, Any]:
    """The fields of one result entry holding ``answers`` (outputs in
    ``codec``, errors in msgpack)."""
    fields: Dict[Any, Any] = {
        "v": WIRE_VERSION,
        "i": b",".join(item_id for item_id, _, _, _ in answers),
        "ok": b"".join(b"1" if ok else b"0" for _, ok, _, _ in answers),
        "k": codec,
    }
    for j, (_, _, payload, buffers) in enumerate(answers):
        fields[f"p{j}"] = payload
        for m, buffer in enumerate(buffers):
            fields[f"b{j}_{m}"] = buffer
    return fields


def legacy_result_entry(item_id: bytes, ok: bool, codec: str, payload: bytes) -> Dict[str, Any]:
    """One answer as a web process of 0.1.0 reads it (no buffers: its codec
    had none)."""
    return {"i": item_id, "ok": "1" if ok else "0", "k": codec, "p": payload}


def parse_results(fields: Any) -> List[Result]:
    """The answers of a result entry; :class:`MalformedEntry` if it is not one."""
    if not isinstance(fields, dict):
        raise MalformedEntry("not a stream entry")
    version = _version(fields)
    if version == 0:  # one answer, as 0.1.0 workers wrote it
        return [Result(_token(fields, b"i"), _flags(fields, 1)[0], _codec_name(fields), _bytes(fields, b"p"), (), 0)]
    ids = _bytes(fields, b"i").split(b",")
    for item_id in ids:
        if not _TOKEN.match(item_id):
            raise MalformedEntry("field 'i' is not a list of ids")
    flags = _flags(fields, len(ids))
    codec = _codec_name(fields)
    payloads = [_bytes(fields, b"p%d" % j) for j in range(len(ids))]
    buffers = _result_buffers(fields, len(ids))
    return [
        Result(item_id, ok, codec if ok else "msgpack", payload, answer_buffers, version)
        for item_id, ok, payload, answer_buffers in zip(ids, flags, payloads, buffers)
    ]


def _flags(fields: Dict[Any, Any], count: int) -> List[bool]:
    value = fields.get(b"ok")
    if not isinstance(value, bytes) or len(value) != count or value.strip(b"01"):
        raise MalformedEntry("field 'ok' is missing or is not one 0 or 1 per answer")
    return [flag == 0x31 for flag in value]


def _result_buffers(fields: Dict[Any, Any], count: int) -> List[Tuple[bytes, ...]]:
    """Each answer's out-of-band buffers ``b<j>_<m>``, in order, none missing."""
    found: Dict[int, int] = {}
    for name in fields:
        match = _RESULT_BUFFER_FIELD.match(name) if isinstance(name, bytes) and name[:1] == b"b" else None
        if match:
            j = int(match.group(1))
            if j >= count:
                raise MalformedEntry("a buffer field names an answer the entry does not hold")
            found[j] = found.get(j, 0) + 1
    return [tuple(_bytes(fields, b"b%d_%d" % (j, m)) for m in range(found.get(j, 0))) for j in range(count)]


# -- fields ----------------------------------------------------------------------------------


def _bytes(fields: Dict[Any, Any], name: bytes) -> bytes:
    value = fields.get(name)
    if not isinstance(value, bytes):
        raise MalformedEntry(f"field {name.decode()!r} is missing")
    return value


def _token(fields: Dict[Any, Any], name: bytes) -> bytes:
    value = _bytes(fields, name)
    if not _TOKEN.match(value):
        raise MalformedEntry(f"field {name.decode()!r} is not an id (1 to 64 letters, digits, '-' or '_')")
    return value


def _int(fields: Dict[Any, Any], name: bytes, low: int, high: int) -> int:
    value = _bytes(fields, name)
    if not (0 < len(value) <= 19 and value.isdigit() and value.isascii()):
        raise MalformedEntry(f"field {name.decode()!r} is not a whole number")
    number = int(value)
    if not low <= number <= high:
        raise MalformedEntry(f"field {name.decode()!r} is out of range ({low} to {high})")
    return number


def _cost(fields: Dict[Any, Any]) -> Optional[float]:
    """Field ``w``, the input's cost: absent, or a finite number > 0."""
    value = fields.get(b"w")
    if value is None:
        return None
    if not isinstance(value, bytes) or not 0 < len(value) <= 32 or not value.isascii():
        raise MalformedEntry("field 'w' is not a cost")
    try:
        cost = float(value)
    except ValueError:
        raise MalformedEntry("field 'w' is not a cost") from None
    if not math.isfinite(cost) or cost <= 0:
        raise MalformedEntry("field 'w' is not a cost (it must be a finite number > 0)")
    return cost


def _trace(fields: Dict[Any, Any]) -> Optional[bytes]:
    """Field ``tp``, the caller's ``traceparent``: kept when it is short
    ASCII (a W3C one is 55 bytes), else dropped; parsed, and a bad one
    ignored, only by a worker that traces. Never a reason to refuse the request."""
    value = fields.get(b"tp")
    if not isinstance(value, bytes) or not 0 < len(value) <= 128 or not value.isascii():
        return None
    return value


def _codec_name(fields: Dict[Any, Any]) -> str:
    value = _bytes(fields, b"k")
    if not _CODEC_NAME.match(value):
        raise MalformedEntry("field 'k' is not a codec name")
    return value.decode()


def _version(fields: Dict[Any, Any]) -> int:
    """The entry's wire version: 0 for entries of 0.1.0, which had no ``v``."""
    if b"v" not in fields:
        return 0
    return _int(fields, b"v", 1, 1_000_000)


def _buffers(fields: Dict[Any, Any]) -> Tuple[bytes, ...]:
    """The out-of-band buffers ``b0 .. bN``, in order, with none missing."""
    names = [name for name in fields if isinstance(name, bytes) and name[:1] == b"b" and _BUFFER_FIELD.match(name)]
    if not names:
        return ()
    buffers = []
    for n in range(len(names)):
        value = fields.get(b"b%d" % n)
        if not isinstance(value, bytes):
            raise MalformedEntry(f"buffer field 'b{n}' is missing")
        buffers.append(value)
    return tuple(buffers)
