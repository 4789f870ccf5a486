"""Which of an upstream answer's header fields a copy of it carries to another client: an entry
(stored, or handed to a flight's waiters) and a stream a follower joins.

A hit is not the upstream's response to this client: no request of its reached the upstream,
took the upstream's time or spent its rate limit. So the fields that describe one exchange do
not cross: the OpenAI SDK shows `x-request-id` as `_request_id` (and Anthropic's `request-id`)
for support tickets, and clients throttle on `x-ratelimit-remaining-*`. What the answer says of
itself does: its content fields, validators (ETag, Last-Modified), Cache-Control, and what is
true of it for every request of its tenant (openai-model, openai-organization, openai-version).
"""

from __future__ import annotations

from collections.abc import Iterable

# Fields an entry never keeps: the hop's framing and connection, what the gateway sets on
# every answer itself (Date, Server, Age, X-Cache, Server-Timing), and Set-Cookie.
NOT_KEPT = frozenset(
    {
        "date",
        "server",
        "set-cookie",
        "age",
        "x-cache",
        "server-timing",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "proxy-connection",
        # RFC 9111 3.1: fields specific to the hop that fetched it are never stored
        "proxy-authenticate",
        "authentication-info",
        "proxy-authentication-info",
        "te",
        "trailer",
        "upgrade",
    }
)

# One exchange's identity and timing: the ids that name it (to the vendor's support, to a
# tracing system, to a CDN's logs) and how long it took. Never true of another client's answer.
_EXCHANGE = frozenset(
    {
        "x-request-id",  # OpenAI, vLLM, most servers; the OpenAI SDK's `_request_id`
        "request-id",  # Anthropic; the Anthropic SDK's `_request_id`
        "apim-request-id",  # Azure OpenAI
        "x-ms-request-id",
        "x-ms-client-request-id",  # Azure echoes the client's own id
        "x-amzn-requestid",
        "x-amz-request-id",
        "x-amzn-trace-id",
        "x-correlation-id",
        "x-trace-id",
        "traceparent",
        "tracestate",
        "traceresponse",
        "x-cloud-trace-context",
        "cf-ray",
        "x-amz-cf-id",
        "fly-request-id",
        "x-vercel-id",
        "x-litellm-call-id",
        "openai-processing-ms",
        "x-response-time",
        "x-runtime",
        "x-process-time",
        "x-litellm-response-duration-ms",
        # an intermediary's view of that one response (its cache state, its node)
        "cf-cache-status",
        "x-served-by",
        "x-cache-hits",
        "x-timer",
        "x-amz-cf-pop",
    }
)
_EXCHANGE_PREFIXES = ("x-envoy-", "x-b3-")  # x-envoy-upstream-service-time, B3 trace ids

# The upstream's rate-limit state and retry advice as it answered. Stale on a stored answer;
# an error shared at once with a flight's waiters keeps them (they hold for the waiters' equal
# credential at that moment, and Retry-After is how an SDK backs off a 429).
_LIMITS = frozenset({"retry-after", "retry-after-ms", "x-should-retry"})
_LIMIT_PREFIXES = ("x-ratelimit-", "anthropic-ratelimit-", "ratelimit", "x-rate-limit-")


def one_exchange(name: str, status: int) -> bool:
    """Is this field (lower case) a fact of the one exchange that fetched an answer of this
    status, untrue of a copy served to another request?"""
    if name in _EXCHANGE or name.startswith(_EXCHANGE_PREFIXES):
        return True
    return 200 <= status < 300 and (name in _LIMITS or name.startswith(_LIMIT_PREFIXES))


def replayable(headers: Iterable[tuple[str, str]], status: int) -> list[tuple[str, str]]:
    """The fields a copy of this answer carries to another client (see the module docstring).
    Also applied to entries read back (stored before these fields were dropped)."""
    return [(k, v) for k, v in headers if not one_exchange(k.lower(), status)]


def kept_headers(headers: list[tuple[str, str]], status: int) -> list[tuple[str, str]]:
    """The response headers an entry keeps: replayable ones, not NOT_KEPT, nor one the answer's
    Connection field names (RFC 9110 7.6.1: hop-by-hop, for this hop alone). The miss's writer
    drops those too; before, the entry kept them and every hit replayed them."""
    named = {
        t.strip().lower() for k, v in headers if k.lower() == "connection" for t in v.split(",")
    }
    return [
        (k, v)
        for k, v in replayable(headers, status)
        if k.lower() not in NOT_KEPT and k.lower() not in named
    ]
