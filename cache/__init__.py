"""Caches: exact-hash result cache (memory and Redis tiers) and, beside it, the semantic cache,
and the flow that runs one cached call through both (cache/flow.py).

Never imports gateway, and backends only through its public face; knows nothing about HTTP.
This module is the face the gateway uses.
"""

from cache.alias import MAX_BODY as ALIAS_MAX_BODY
from cache.alias import AliasKey
from cache.asks import AnswerIncomplete, Answers, Ask, Fresh, Hit
from cache.cache import Cache
from cache.codec import CacheEntry
from cache.errors import CacheError, CodecError, TierError, TierTimeout
from cache.flow import CacheFlow
from cache.flows import Flows
from cache.hit_headers import replayable
from cache.keys import CacheKey, KeyBuilder, Selector, canonical, tenant_of
from cache.live_streams import StreamCut
from cache.policy import (
    CACHED_METHODS,
    CONDITIONAL_HEADERS,
    SAFE_METHODS,
    NotCached,
    RequestDirectives,
    request_directives,
)
from cache.recording import Recording
from cache.route_cache import RouteCache
from cache.semantic.off import NoSemantic
from cache.semantic.preflight import preflight as semantic_preflight
from cache.semantic.route import SemanticRoute
from cache.semantic.setup import SemanticSetup, build_semantic, semantic_routes
from cache.settings import CachePolicy, CacheSettings
from cache.singleflight import CallerGone, SingleFlight
from cache.tenant import SECRET_ENV, identity_from_purge, share_generated_secret
from cache.validators import evaluated_here, not_modified

__all__ = [
    "ALIAS_MAX_BODY",
    "CACHED_METHODS",
    "CONDITIONAL_HEADERS",
    "SAFE_METHODS",
    "SECRET_ENV",
    "AliasKey",
    "AnswerIncomplete",
    "Answers",
    "Ask",
    "Cache",
    "CacheEntry",
    "CacheError",
    "CacheFlow",
    "CacheKey",
    "CachePolicy",
    "CacheSettings",
    "CallerGone",
    "CodecError",
    "Flows",
    "Fresh",
    "Hit",
    "KeyBuilder",
    "NoSemantic",
    "NotCached",
    "Recording",
    "RequestDirectives",
    "RouteCache",
    "Selector",
    "SemanticRoute",
    "SemanticSetup",
    "SingleFlight",
    "StreamCut",
    "TierError",
    "TierTimeout",
    "build_semantic",
    "canonical",
    "evaluated_here",
    "identity_from_purge",
    "not_modified",
    "replayable",
    "request_directives",
    "semantic_preflight",
    "semantic_routes",
    "share_generated_secret",
    "tenant_of",
]
