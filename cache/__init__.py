"""Caches: exact-hash result cache (memory and Redis tiers) and, beside it, the semantic cache.

Never imports gateway or backends; knows nothing about HTTP.
"""

from cache.cache import Cache, RouteCache
from cache.codec import CacheEntry
from cache.errors import CacheError, CodecError, TierError, TierTimeout
from cache.keys import CacheKey, KeyBuilder, Selector, canonical

__all__ = [
    "Cache",
    "CacheEntry",
    "CacheError",
    "CacheKey",
    "CodecError",
    "KeyBuilder",
    "RouteCache",
    "Selector",
    "TierError",
    "TierTimeout",
    "canonical",
]
