"""Secrets never reach the logs: a logging filter that masks credentials in every record.

Masks Authorization-style headers, bearer tokens, OpenAI-style keys, passwords in URLs, and the
exact secret values the config holds (the admin token). `settings_view` is /admin/config's copy
of the settings, with the secrets the config holds masked.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from typing import Any

from gateway.config import Settings

MASK = "***"

_PATTERNS = (
    # Header-like "Name: value" / "name=value" for credential-bearing names (one token, or a
    # scheme and a token).
    re.compile(
        r"(?i)(?<![A-Za-z0-9])((?:proxy-)?authorization|x-api-key|api[-_]?key|x-admin-token|cookie|set-cookie"
        r"|password|subscription-key)"
        r"(['\"]?\s*[:=]\s*['\"]?)((?:bearer\s+|basic\s+)?[^'\"\s,;&}]+)"
    ),
    re.compile(r"(?i)\b(bearer|basic)(\s+)([A-Za-z0-9._~+/=-]+)"),
    re.compile(r"()()\bsk-[A-Za-z0-9_-]{8,}"),
    re.compile(r"(://[^/\s:@]*)(:)([^/\s@]+)(?=@)"),
)


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    for value in secrets:
        if value:
            text = text.replace(value, MASK)
    for pattern in _PATTERNS:
        text = pattern.sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}", text)
    return text


class RedactingFilter(logging.Filter):
    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self.secrets = tuple(s for s in secrets if s and len(s) >= 4)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(message, self.secrets)
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text, self.secrets)
        if clean != message:
            record.msg, record.args = clean, None
        return True


def settings_view(settings: Settings) -> Any:
    """The settings as /admin/config shows them: the admin token, the tenant secret and every
    header value the config sends upstream (a judge's `headers`: its credential, whatever the
    header is called) masked, then the text masks of the logs (passwords in Redis URLs)."""
    data = _mask_headers(settings.model_dump(mode="json"))
    if data.get("admin", {}).get("token"):
        data["admin"]["token"] = MASK
    if data.get("cache", {}).get("tenant_secret"):
        data["cache"]["tenant_secret"] = MASK
    return json.loads(redact(json.dumps(data)))


def _mask_headers(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: {h: MASK for h in v} if k == "headers" and isinstance(v, dict) else _mask_headers(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_mask_headers(v) for v in value]
    return value


def config_secrets(settings: Settings) -> list[str]:
    return [s for s in (settings.admin.token,) if s]


def install_redaction(settings: Settings, logger: logging.Logger | None = None) -> RedactingFilter:
    """Attach the filter to every root handler (handlers see the records of all loggers)."""
    flt = RedactingFilter(config_secrets(settings))
    for handler in (logger or logging.getLogger()).handlers:
        handler.addFilter(flt)
    return flt
