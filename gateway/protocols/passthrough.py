"""Passthrough adapter: the body is opaque; a key covers method, path, query and body bytes."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from gateway.protocols.base import Call


class PassthroughAdapter:
    name = "passthrough"

    def parse(
        self,
        method: str,
        path: str,
        query: str,
        content_type: str,
        body: bytes,
        headers: Mapping[str, str] | None = None,
    ) -> Call | None:
        digest = hashlib.blake2b(body, digest_size=16).hexdigest()
        return Call(
            "passthrough",
            None,
            {"method": method, "path": path, "query": query, "body": digest},
            # The gateway cannot tell sampling in an unknown body: caching a passthrough route
            # is the operator's explicit choice (exact.enabled), so its calls count as
            # determined by the request.
            deterministic=True,
            kind="raw",
        )
