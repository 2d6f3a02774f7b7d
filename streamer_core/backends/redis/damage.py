"""What others may have written into a model's keys, and what is done
about it: an entry that does not parse goes to the dead-letter stream
(:class:`DeadLetters`: logged once by key and id, never its payload; a
truncated copy kept for inspection), and a key that holds the wrong Redis
type is deleted and made again (:func:`repair_key`), with one error logged.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Dict, Optional

from ...telemetry.stats import ModelStats
from .wire import Keys

__all__ = ["DEAD_MAXLEN", "DEAD_FIELD_BYTES", "DeadLetters", "is_wrong_type", "repair_key"]

logger = logging.getLogger("streamer_core.redis")

# The dead-letter stream keeps about this many entries, each field cut to
# DEAD_FIELD_BYTES: it shows what was dropped without holding its payloads.
DEAD_MAXLEN = 1000
DEAD_FIELD_BYTES = 256

# Delete KEYS[1] if it holds a Redis type other than ARGV[1] (and is not
# missing); return the type it held, or false.
_REPAIR_SCRIPT = """
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= ARGV[1] and kind ~= 'none' then
  redis.call('DEL', KEYS[1])
  return kind
end
return false
"""


class DeadLetters:
    """Where entries that do not parse go: a capped stream,
    ``streamer:<prefix>:dead``, holding for each its key, id, the reason,
    and its fields cut to ``DEAD_FIELD_BYTES`` (field ``f:<name>``), so an
    operator can see what was written without it holding payloads. Each is
    logged once, by key and id, at most ``log_limit`` lines a minute (then a
    count of the rest), and counted in ``stats`` (the model's numbers,
    for ``streamer_redis_dead_lettered_total``) where it is set."""

    def __init__(self, keys: Keys, log_limit: int = 20, stats: Optional[ModelStats] = None) -> None:
        self._key = keys.dead
        self.stats = stats
        self._log_limit = log_limit
        self._window_start = float("-inf")
        self._logged = 0
        self._unlogged = 0

    def add(self, pipe: Any, key: str, entry_id: Any, fields: Any, reason: str) -> None:
        """Queue on ``pipe`` (a pipeline the caller executes with
        ``raise_on_error=False``) a copy of the entry in the dead-letter
        stream, and log it."""
        copy: Dict[Any, Any] = {
            "key": key,
            "id": entry_id if isinstance(entry_id, bytes) else repr(entry_id),
            "reason": reason,
        }
        if isinstance(fields, dict):
            for name, value in list(fields.items())[:64]:
                if isinstance(name, bytes) and isinstance(value, bytes):
                    copy[b"f:" + name[:DEAD_FIELD_BYTES]] = value[:DEAD_FIELD_BYTES]
        pipe.xadd(self._key, copy, maxlen=DEAD_MAXLEN, approximate=True)
        if self.stats is not None:
            self.stats.dead_lettered()
        self._log(key, entry_id, reason)

    def _log(self, key: str, entry_id: Any, reason: str) -> None:
        now = time.monotonic()
        if now - self._window_start >= 60.0:
            if self._unlogged:
                logger.warning(
                    "... and %d more malformed entries in the last minute (see %s)", self._unlogged, self._key
                )
            self._window_start, self._logged, self._unlogged = now, 0, 0
        if self._logged >= self._log_limit:
            self._unlogged += 1
            return
        self._logged += 1
        shown = entry_id.decode(errors="replace") if isinstance(entry_id, bytes) else repr(entry_id)
        logger.warning("dropped malformed entry %s of %s: %s (a copy is in %s)", shown, key, reason, self._key)


def is_wrong_type(exc: BaseException) -> bool:
    """Whether a Redis error says a key holds another type than the command needs."""
    return str(exc).startswith("WRONGTYPE")


def repair_key(conn: Any, key: str, expected: str) -> Optional[str]:
    """Delete ``key`` if it holds a Redis type other than ``expected``
    (e.g. ``"stream"``), logging one error; return the type it held, or
    ``None`` if it was fine (or missing). Atomic: a key of the right type
    that a peer has just made is never deleted."""
    held = conn.eval(_REPAIR_SCRIPT, 1, key, expected)
    if not held:
        return None
    held = held.decode() if isinstance(held, bytes) else str(held)
    logger.error(
        "%s held a Redis %s, not a %s: something else writes to this key; deleted it so that serving goes on",
        key, held, expected,
    )  # fmt: skip
    return held
