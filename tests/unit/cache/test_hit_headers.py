"""Which of an answer's fields a copy of it carries: its own, never one exchange's."""

from __future__ import annotations

from cache.hit_headers import kept_headers, replayable

FIELDS = [
    ("Content-Type", "application/json"),
    ("ETag", '"v1"'),
    ("openai-model", "gpt-test"),
    ("X-Request-Id", "req_1"),
    ("request-id", "req_2"),
    ("x-envoy-upstream-service-time", "41"),
    ("Retry-After", "2"),
    ("x-ratelimit-remaining-tokens", "99"),
    ("RateLimit-Policy", "10;w=1"),
]


def test_a_stored_answer_keeps_its_own_fields_not_the_exchanges() -> None:
    kept = kept_headers([*FIELDS, ("Authentication-Info", "nextnonce=x")], 200)
    assert kept == [
        ("Content-Type", "application/json"),
        ("ETag", '"v1"'),
        ("openai-model", "gpt-test"),
    ]


def test_an_error_shared_with_waiters_keeps_its_retry_advice_not_its_id() -> None:
    """A 429 handed at once to a flight's waiters: its Retry-After and rate-limit state hold
    for them too (same credential, same moment), its request id does not."""
    names = [k for k, _ in replayable(FIELDS, 429)]
    assert "Retry-After" in names and "x-ratelimit-remaining-tokens" in names
    assert "X-Request-Id" not in names and "request-id" not in names
