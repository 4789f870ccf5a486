"""CacheError tree. The cache never lets these reach a request: they become misses and metrics.

CacheError
├── CodecError        a stored entry did not decode (deleted, counted)
└── TierError         a tier could not answer (Redis down, slow, refused)
    └── TierTimeout   it did not answer in time (also a TimeoutError)
"""

from __future__ import annotations


class CacheError(Exception):
    pass


class CodecError(CacheError):
    pass


class TierError(CacheError):
    pass


class TierTimeout(TierError, TimeoutError):
    pass
