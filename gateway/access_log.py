"""The opt-in access log (`logging.access_log`): one line per request on `latentgate.access`.

"common" is Apache's Common Log Format; "json" is one object per line for log pipelines. Secrets
are masked by the redaction filter on the handlers, like every other record.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from aiohttp.abc import AbstractAccessLogger
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse

COMMON = '%a - - %t "%r" %s %b'


class JsonAccessLogger(AbstractAccessLogger):
    def log(self, request: BaseRequest, response: StreamResponse, time: float) -> None:
        record = {
            "remote": request.remote,
            "method": request.method,
            "path": request.path,
            "query": request.query_string or None,
            "status": response.status,
            "bytes": response.body_length,
            "duration_ms": round(time * 1000, 3),
            "x_cache": response.headers.get("X-Cache"),
            "user_agent": request.headers.get("User-Agent"),
        }
        self.logger.info(json.dumps(record))

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)


def runner_options(mode: bool | str) -> dict[str, Any]:
    """AppRunner keyword arguments for `logging.access_log` (off: no access logger at all)."""
    if mode is False:
        return {"access_log": None}
    logger = logging.getLogger("latentgate.access")
    if mode == "json":
        return {"access_log": logger, "access_log_class": JsonAccessLogger}
    return {"access_log": logger, "access_log_format": COMMON}
