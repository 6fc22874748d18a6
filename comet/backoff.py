"""How long to wait before the next attempt of something that failed.

One rule for every retry loop of the project: exponential backoff with
jitter, capped, and a server's ``Retry-After`` honoured where the answer
has one.  The wait before retry ``n`` (0 for the first retry) is drawn from
the upper half of ``min(cap, first * 2**n)``: clients that failed together
do not all come back at once, and none waits less than half its step.
"""

from __future__ import annotations

import email.utils
import random
import time

MAX_RETRY_AFTER_S = 900.0
"""A Retry-After above this is read as this (a hostile or broken answer must
not park a client for days)."""


def backoff_delay(retry: int, first: float, cap: float) -> float:
    """Seconds to wait before retry ``retry`` (0-based): ``first`` doubling up
    to ``cap``, each drawn from the upper half of its step."""
    step = min(cap, first * 2 ** retry)
    return step * random.uniform(0.5, 1.0)


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """Seconds from a Retry-After header (delay-seconds or an HTTP-date,
    capped at ``MAX_RETRY_AFTER_S``); None when absent or unreadable (then
    the backoff applies)."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if seconds != seconds:  # NaN
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


def next_wait_s(retry: int, first: float, cap: float, retry_after: float | None = None) -> float:
    """The wait before retry ``retry``: the server's Retry-After when it gave
    one, else the backoff."""
    return retry_after if retry_after is not None else backoff_delay(retry, first, cap)
