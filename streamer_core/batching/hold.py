"""When a free worker should stop waiting for companions: :class:`HoldPolicy`.

Shared by the in-process scheduler (:mod:`streamer_core.batching.scheduler`) and the
Redis worker, so a batch is held by the same rule wherever it forms: never
past ``max_latency`` from its oldest input's arrival, and, short of that, only
while callers just answered are expected back (a closed loop: a client pool,
a busy web server). When nobody is due, a lone request goes at once.
"""

from __future__ import annotations

from collections import deque
from typing import Deque, Optional, Tuple

__all__ = ["HoldPolicy", "STILL_ARRIVING"]

# Share of the model's recent service time that a free worker stays idle
# waiting for callers it has just answered to come back; past it, it goes on
# waiting only while they are still arriving (each within STILL_ARRIVING of
# the last), up to _MAX_PATIENCE_SHARE.
_PATIENCE_SHARE = 0.25
_MAX_PATIENCE_SHARE = 0.5
_MIN_PATIENCE = 0.001
#: Seconds within which callers coming back one after another count as still arriving.
STILL_ARRIVING = 0.001
# Weight of the newest sample in the running estimates of a batch's service
# time and of how long answered callers take to come back.
_SERVICE_EWMA = 0.2
# Patience covers this much more than the callers' recent time to come back,
# the slowest of the last few deliveries (each older one counts for less).
_RETURN_MARGIN = 1.25
_COMEBACK_DECAY = 0.9
# At most this share of a batch's time is spent waiting for callers known to
# come back: a batch run without them would make them wait a whole batch.
_COMEBACK_SHARE = 1.0
# How many of the latest batches' times :meth:`HoldPolicy.fastest` looks at,
# how many it needs (one batch may be a cold start, or a stall), and how
# recent they must be (seconds): an estimate nothing has refreshed for that
# long is not trusted, so a model that sped up is given batches again.
_RECENT_BATCHES = 8
_FEWEST_BATCHES = 3
_FRESH_S = 10.0


class HoldPolicy:
    """When a free worker should stop waiting for companions.

    Shared by the in-process :class:`Scheduler` and the Redis worker. The
    caller reports arrivals and deliveries; :meth:`hold_until` says until when
    a partial batch whose oldest item arrived at ``oldest`` may still wait:
    never past ``oldest + max_latency``, and only while callers just answered
    are expected back (see the module docstring).
    """

    __slots__ = ("max_latency", "due", "last_delivery", "last_arrival", "service", "comeback", "_awaited", "_recent")

    def __init__(self, max_latency: float) -> None:
        self.max_latency = max_latency
        self.due = 0  # callers answered recently and expected back
        self.last_delivery = float("-inf")
        self.last_arrival = float("-inf")
        self.service: Optional[float] = None  # running estimate of one batch's time, seconds
        # How long after answering n callers n new inputs have arrived, lately,
        # seconds: the callers' round trip (longer through a broker than
        # in-process), which patience must cover to be worth it.
        self.comeback: Optional[float] = None
        self._awaited = 0  # inputs still to arrive before the comeback is measured
        # The latest batches: when each was answered, and its time, seconds.
        self._recent: Deque[Tuple[float, float]] = deque(maxlen=_RECENT_BATCHES)

    def arrived(self, n: int, now: float) -> int:
        """``n`` inputs arrived; return how many answered callers are still due."""
        self.last_arrival = now
        if self.due:
            self.due = max(0, self.due - n)
        if self._awaited > 0:
            self._awaited -= n
            if self._awaited <= 0:
                # The slow returns matter (a large batch's callers take longest
                # to come back), and holding ends anyway once those due are back.
                sample = now - self.last_delivery
                comeback = self.comeback
                self.comeback = sample if comeback is None else max(sample, _COMEBACK_DECAY * comeback)
        return self.due

    def delivered(self, n: int, seconds: float, now: float) -> None:
        """A batch of ``n`` inputs that ran for ``seconds`` is being answered."""
        service = self.service
        self.service = seconds if service is None else service + _SERVICE_EWMA * (seconds - service)
        self._recent.append((now, seconds))
        if now - self.last_delivery > _MAX_PATIENCE_SHARE * self.service:
            self.due = 0
        self.due += n
        self.last_delivery = now
        self._awaited = n

    def fastest(self, now: float) -> Optional[float]:
        """The shortest of the latest batches' times, seconds: about the
        least the next batch will take. ``None`` (not known) unless at least
        :data:`_FEWEST_BATCHES` of them ended within the last
        :data:`_FRESH_S` seconds."""
        fresh = [seconds for ended, seconds in self._recent if now - ended <= _FRESH_S]
        return min(fresh) if len(fresh) >= _FEWEST_BATCHES else None

    def still_arriving(self, now: float) -> bool:
        """Whether callers answered lately are still coming back: some are
        due, and one came back (or they were answered) within the last
        :data:`STILL_ARRIVING` seconds."""
        return self.due > 0 and now - max(self.last_arrival, self.last_delivery) < STILL_ARRIVING

    def hold_until(self, oldest: float, now: float) -> float:
        """Until when to wait for companions; a time ``<= now`` means go now."""
        return min(oldest + self.max_latency, self._returners_until(now))

    def _returners_until(self, now: float) -> float:
        if self.due <= 0 or self.service is None:
            return float("-inf")
        patience = max(_MIN_PATIENCE, _PATIENCE_SHARE * self.service)
        if self.comeback is not None:  # callers take longer than that to come back: wait for them, within bounds
            patience = max(patience, min(_COMEBACK_SHARE * self.service, _RETURN_MARGIN * self.comeback))
        longest = self.last_delivery + max(patience, _MAX_PATIENCE_SHARE * self.service)
        until = min(longest, max(self.last_delivery + patience, self.last_arrival + STILL_ARRIVING))
        if now >= until:
            self.due = 0
            return float("-inf")
        return until
