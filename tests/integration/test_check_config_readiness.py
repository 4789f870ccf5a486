"""`readiness.require` naming a missing backend, or a remote one without a health_check, is
reported at the name's own path and line, beside every other error. Before, check-config said
`<root> (line N)`, N the document's first line, and only once every other field was valid."""

from __future__ import annotations

import pytest

from gateway.config import ConfigError, parse_settings

CONFIG = """\
# comments above the document
backends:
  checked: {kind: remote, replicas: ["http://127.0.0.1:1"], health_check: {path: /health}}
  unchecked: {kind: remote, replicas: ["http://127.0.0.1:2"]}
routes: [{name: all, match: {prefix: /}, backend: checked, protocol: passthrough}]
limits: {max_body_bytes: %s}
readiness:
  require:
    - checked
    - unchecked
    - missing
"""


def _issues(text: str) -> list[str]:
    with pytest.raises(ConfigError) as err:
        parse_settings(text)
    return [str(i) for i in err.value.issues]


def test_each_required_name_is_reported_where_it_is() -> None:
    assert _issues(CONFIG % "1024") == [
        "readiness.require.1 (line 10): readiness.require names remote backend 'unchecked': "
        "give it a health_check so its replicas are probed before any traffic",
        "readiness.require.2 (line 11): readiness.require names 'missing', which is not under "
        "backends",
    ]


def test_with_the_other_field_errors() -> None:
    issues = _issues(CONFIG % "lots")
    assert issues[0].startswith("limits.max_body_bytes (line 6): ")
    assert [i.split(":")[0] for i in issues[1:]] == [
        "readiness.require.1 (line 10)",
        "readiness.require.2 (line 11)",
    ]


def test_a_checked_backend_passes() -> None:
    settings = parse_settings(CONFIG.split("    - unchecked")[0] % "1024")
    assert settings.readiness.require == ["checked"]
