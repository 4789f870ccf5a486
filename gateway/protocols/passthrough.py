"""Passthrough adapter: the body is opaque; a key covers method, path, query, body bytes and
(with a body) its Content-Type."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from gateway.protocols.base import Call


class PassthroughAdapter:
    name = "passthrough"
    keyed_headers: tuple[str, ...] = ()

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
        fields = {"method": method, "path": path, "query": query, "body": digest}
        if body:
            # a replica reads a body by its type: the same bytes as text/plain and as JSON (or
            # form data) are two requests. A bodiless one (a GET) is keyed as before, as the
            # HEAD lookup and unsafe-method invalidation key the GET of a target.
            fields["type"] = content_type
        return Call(
            "passthrough",
            None,
            fields,
            # The gateway cannot tell sampling in an unknown body: caching a passthrough route
            # is the operator's explicit choice (exact.enabled), so its calls count as
            # determined by the request.
            deterministic=True,
            kind="raw",
        )
