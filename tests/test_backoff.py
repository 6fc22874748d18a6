"""comet/backoff.py, the one backoff of every retry loop: exponential, jittered into the
upper half of each step, capped; a server's Retry-After before it."""

from __future__ import annotations

import random

import pytest

from comet.backoff import MAX_RETRY_AFTER_S, backoff_delay, next_wait_s, retry_after_s
from gateway import client


@pytest.mark.parametrize("retry, first, cap, low, high", [
    (0, 0.5, 30.0, 0.25, 0.5),
    (1, 0.5, 30.0, 0.5, 1.0),
    (3, 0.5, 30.0, 2.0, 4.0),
    (6, 0.5, 30.0, 15.0, 30.0),  # 32 s capped at 30
    (60, 0.5, 30.0, 15.0, 30.0),
    (0, 0.1, 5.0, 0.05, 0.1),
])
def test_the_backoff_doubles_to_its_cap_within_the_upper_half(
        retry: int, first: float, cap: float, low: float, high: float) -> None:
    waits = [backoff_delay(retry, first, cap) for _ in range(500)]
    assert all(low <= w <= high for w in waits)
    assert max(waits) - min(waits) > (high - low) / 4  # jittered, not one value


def test_the_producer_client_carries_the_same_backoff() -> None:
    """gateway/client.py writes the rule out (a producer copies that one file): same draws."""
    for attempt in range(1, 12):
        random.seed(attempt)
        copied = client._backoff(attempt)
        random.seed(attempt)
        assert copied == pytest.approx(backoff_delay(attempt - 1, client.BACKOFF_FIRST_S,
                                                     client.BACKOFF_MAX_S))


def test_retry_after_is_seconds_or_a_date_within_bounds() -> None:
    assert retry_after_s("2") == 2.0 and retry_after_s(" 1.5 ") == 1.5
    assert retry_after_s("-4") == 0.0
    assert retry_after_s("99999") == MAX_RETRY_AFTER_S
    assert retry_after_s("Wed, 21 Oct 2099 07:28:00 GMT", now=0) == MAX_RETRY_AFTER_S
    assert retry_after_s("Thu, 01 Jan 1970 00:00:30 GMT", now=0) == 30.0
    assert retry_after_s("Thu, 01 Jan 1970 00:00:30 GMT", now=100) == 0.0
    for unreadable in (None, "", "soon", "nan"):
        assert retry_after_s(unreadable) is None


def test_a_servers_retry_after_wins_over_the_backoff() -> None:
    assert next_wait_s(5, 0.5, 30.0, retry_after=1.25) == 1.25
    assert next_wait_s(5, 0.5, 30.0, retry_after=0.0) == 0.0
    assert 8.0 <= next_wait_s(5, 0.5, 30.0) <= 16.0
