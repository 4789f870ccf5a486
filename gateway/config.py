"""Root settings: load YAML once, interpolate `${VAR:-default}`, validate, report errors with lines.

Each package owns its own settings models (cache/settings.py, backends/settings.py); this module
only composes them and knows where in the file each value came from.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from backends import BackendSettings, RoutePolicy
from cache import CachePolicy, CacheSettings
from gateway.config_aliases import alias_issue
from gateway.config_refs import (
    BACKEND_REF,
    ConfigIssue,
    http_to_grpc,
    listener_clashes,
    missing_backend,
    reference_issues,
)
from gateway.config_semantic import semantic_findings, semantic_issues


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ListenerSettings(_Frozen):
    """A named network location: a TCP host:port or a unix socket path (not both).

    protocol: `http` (the aiohttp edge) or `grpc` (Open Inference v2 over gRPC, gateway/grpc).
    """

    name: str = "main"
    protocol: Literal["http", "grpc"] = "http"
    host: str | None = None
    port: int | None = Field(None, ge=0, le=65535)
    unix: str | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> ListenerSettings:
        tcp = self.host is not None or self.port is not None
        if tcp == (self.unix is not None):
            raise ValueError("a listener has either host/port or unix, not both and not neither")
        if tcp and self.port is None:
            # without one it would bind wherever the OS says, where no client or probe looks
            raise ValueError("a TCP listener needs a port (0 for any free one)")
        return self


class AdminSettings(_Frozen):
    token: str | None = None
    # Where /admin/* is served; None keeps it on the main listeners (probes stay on every listener).
    listener: ListenerSettings | None = None
    # Where /metrics answers. Its per-route counters (requests, hits, semantic budgets) describe
    # every tenant's traffic in aggregate: a multi-tenant deployment can keep them off the
    # listeners its clients reach (`admin_listener`, which needs `listener`).
    metrics: Literal["every_listener", "admin_listener"] = "every_listener"

    @model_validator(mode="after")
    def _metrics_has_a_home(self) -> AdminSettings:
        if self.metrics == "admin_listener" and self.listener is None:
            raise ValueError("admin.metrics: admin_listener needs admin.listener")
        return self


class LimitSettings(_Frozen):
    max_body_bytes: int = Field(16 << 20, ge=1)
    max_header_bytes: int = Field(8190, ge=256)
    max_headers: int = Field(100, ge=1)
    client_idle_timeout_s: float = Field(75.0, gt=0)
    body_read_timeout_s: float = Field(30.0, gt=0)
    shutdown_grace_s: float = Field(30.0, ge=0)
    header_timeout_s: float = Field(10.0, gt=0)
    max_connections_per_client: int = Field(256, ge=1)
    # The cap is about remote clients: loopback peers, like unix-socket ones, are processes on
    # this host (a sidecar's application, whose pool may hold hundreds of connections), unless
    # this is true.
    cap_loopback_clients: bool = False


class LoggingSettings(_Frozen):
    level: Literal["debug", "info", "warning", "error"] = "info"
    # One line per request on the `latentgate.access` logger: true or "common" (Apache's common
    # log format), "json" (one object per line, with the duration); off by default.
    access_log: bool | Literal["common", "json"] = False


class ReadinessSettings(_Frozen):
    """/readyz is the gateway's own readiness (engines loaded, listeners open, not draining);
    backends named here must also be reachable (a remote one needs a health_check)."""

    require: list[str] = []


class TracingSettings(_Frozen):
    """OpenTelemetry spans per stage (needs the `otel` extra); off by default."""

    enabled: bool = False
    service_name: str = "latentgate"
    otlp_endpoint: str | None = None
    sample_ratio: float = Field(1.0, ge=0.0, le=1.0)


class RouteMatch(_Frozen):
    path: str | None = None
    prefix: str | None = None
    methods: list[str] | None = None
    model: str | None = None

    @model_validator(mode="after")
    def _path_or_prefix(self) -> RouteMatch:
        if (self.path is None) == (self.prefix is None):
            raise ValueError("match needs exactly one of path or prefix")
        return self


class RouteLimits(_Frozen):
    # Items per request: /v1/embeddings `input` entries, v2 infer batch rows (a tensor's first
    # dimension) and v2 named inputs and outputs. More → 413 before any tokenising or dispatch.
    max_items: int = Field(2048, ge=1)


class RouteSettings(_Frozen):
    name: str
    match: RouteMatch
    # grpc: routes the gRPC listener reads (match paths are gRPC method paths).
    protocol: Literal["openai", "anthropic", "v2", "passthrough", "grpc"] = "passthrough"
    backend: str
    cache: CachePolicy = CachePolicy()
    upstream: RoutePolicy = RoutePolicy()
    limits: RouteLimits = RouteLimits()


class Settings(_Frozen):
    listeners: list[ListenerSettings] = [ListenerSettings(host="127.0.0.1", port=8080)]
    admin: AdminSettings = AdminSettings()
    limits: LimitSettings = LimitSettings()
    logging: LoggingSettings = LoggingSettings()
    tracing: TracingSettings = TracingSettings()
    readiness: ReadinessSettings = ReadinessSettings()
    cache: CacheSettings = CacheSettings()
    backends: dict[str, BackendSettings]
    routes: list[RouteSettings] = Field(min_length=1)

    @model_validator(mode="after")
    def _references(self) -> Settings:
        names: set[str] = set()
        raw_backends = {name: spec.model_dump() for name, spec in self.backends.items()}
        for route in self.routes:
            if route.backend not in self.backends:
                raise PydanticCustomError(
                    BACKEND_REF, missing_backend(route.name, route.backend, self.backends)
                )
            if route.name in names:  # (said with its line by reference_issues)
                raise PydanticCustomError(BACKEND_REF, f"route name {route.name!r} is used twice")
            names.add(route.name)
            backend = self.backends[route.backend]
            if route.protocol != "grpc" and getattr(backend, "wire", "http") == "grpc":
                raise PydanticCustomError(
                    BACKEND_REF, http_to_grpc(route.name, route.protocol, route.backend)
                )
            if found := semantic_findings(route.model_dump(), raw_backends):
                raise PydanticCustomError(BACKEND_REF, found[0][1])  # lines: semantic_issues
        listeners = [
            (("listeners", str(i)), ls.model_dump()) for i, ls in enumerate(self.listeners)
        ]
        if self.admin.listener is not None:
            listeners.append((("admin", "listener"), self.admin.listener.model_dump()))
        if listener_clashes(listeners):  # said with its path and line by listener_issues
            raise PydanticCustomError(BACKEND_REF, "listeners")
        for name in self.readiness.require:
            spec = self.backends.get(name)
            if spec is None or (
                spec.kind == "remote" and getattr(spec, "health_check", None) is None
            ):  # said with its path and line by readiness_issues
                raise PydanticCustomError(BACKEND_REF, "readiness.require")
        return self


class ConfigError(Exception):
    def __init__(self, source: str, issues: list[ConfigIssue]) -> None:
        self.source = source
        self.issues = issues
        super().__init__(f"{source}: " + "; ".join(str(i) for i in issues))


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def interpolate(text: str, environ: Mapping[str, str]) -> str:
    """Replace `${VAR}` and `${VAR:-default}`; an unset variable without a default is empty
    (parse_settings reports it as an error)."""

    def sub(m: re.Match[str]) -> str:
        value = environ.get(m.group(1))
        if value is None or (value == "" and m.group(2) is not None):
            return m.group(2) or ""
        return value

    return _VAR.sub(sub, text)


def _line_index(node: yaml.Node, prefix: tuple[str, ...], out: dict[tuple[str, ...], int]) -> None:
    out[prefix] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            path = (*prefix, str(key.value))
            out[path] = key.start_mark.line + 1
            _line_index(value, path, out)
            out[path] = key.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _line_index(item, (*prefix, str(i)), out)


_MERGE = "tag:yaml.org,2002:merge"


def _duplicate_keys(
    node: yaml.Node, prefix: tuple[str, ...] = (), seen: set[int] | None = None
) -> list[ConfigIssue]:
    """A key given twice in one mapping: YAML loaders keep the last silently, so `limits:`
    written twice would drop the first block without a word. Merge keys (`<<: *x`) are YAML's
    own way to override and are left alone; an anchored node is looked at once."""
    seen = set() if seen is None else seen
    if id(node) in seen:
        return []
    seen.add(id(node))
    issues: list[ConfigIssue] = []
    if isinstance(node, yaml.MappingNode):
        first: dict[str, int] = {}
        for key, value in node.value:
            name = str(key.value)
            path = (*prefix, name)
            if key.tag != _MERGE:
                line = key.start_mark.line + 1
                if name in first:
                    issues.append(
                        ConfigIssue(
                            ".".join(path),
                            line,
                            f"duplicate key (first given on line {first[name]})",
                        )
                    )
                else:
                    first[name] = line
            issues += _duplicate_keys(value, path, seen)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            issues += _duplicate_keys(item, (*prefix, str(i)), seen)
    return issues


def unset_variables(text: str, environ: Mapping[str, str]) -> list[str]:
    """`${VAR}` references (no default) whose variable is not in the environment."""
    return [
        m.group(1) for m in _VAR.finditer(text) if m.group(2) is None and m.group(1) not in environ
    ]


def _interpolate_tree(
    value: Any,
    environ: Mapping[str, str],
    path: tuple[str, ...] = (),
    unset: dict[tuple[str, ...], list[str]] | None = None,
) -> Any:
    if isinstance(value, str):
        if unset is not None and (names := unset_variables(value, environ)):
            unset[path] = names
        out = interpolate(value, environ)
        # An emptied `${VAR:-}` means "not set" so optional fields stay None.
        return None if out == "" and _VAR.search(value) else out
    if isinstance(value, list):
        return [_interpolate_tree(v, environ, (*path, str(i)), unset) for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: _interpolate_tree(v, environ, (*path, str(k)), unset) for k, v in value.items()}
    return value


def _line_of(loc: tuple[str, ...], lines: dict[tuple[str, ...], int]) -> int | None:
    for n in range(len(loc), -1, -1):
        if loc[:n] in lines:
            return lines[loc[:n]]
    return None


def _unset_message(names: list[str]) -> str:
    what = f"variable {names[0]} is" if len(names) == 1 else f"variables {', '.join(names)} are"
    return (
        f"environment {what} not set and has no default "
        f"(set it, or write ${{{names[0]}:-default}} for an optional value)"
    )


def parse_settings(
    text: str, source: str = "<config>", environ: Mapping[str, str] | None = None
) -> Settings:
    """Validate a YAML document; raise ConfigError listing every problem with its line."""
    env = os.environ if environ is None else environ
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        alias = alias_issue(node) if node is not None else None
        if alias is not None:
            raise ConfigError(source, [ConfigIssue("", *alias)])
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        raise ConfigError(source, [ConfigIssue("", line, f"not valid YAML: {exc}")]) from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(source, [ConfigIssue("", 1, "the top level must be a mapping")])
    lines: dict[tuple[str, ...], int] = {}
    duplicates: list[ConfigIssue] = []
    if node is not None:
        _line_index(node, (), lines)
        duplicates = _duplicate_keys(node)  # said with every other problem, first
    unset: dict[tuple[str, ...], list[str]] = {}
    data = _interpolate_tree(raw, env, (), unset)
    # An unset `${VAR}` is an error where it is used, whatever the field would accept.
    unset_issues = [
        ConfigIssue(".".join(path), _line_of(path, lines), _unset_message(names))
        for path, names in unset.items()
    ]
    try:
        settings = Settings.model_validate(data)
    except ValidationError as exc:
        issues = []
        for err in exc.errors():
            if err["type"] == BACKEND_REF:
                continue  # reported below with its path and line
            loc = tuple(str(p) for p in err["loc"])
            # Discriminated unions insert the tag into loc; drop it for the user-facing path.
            loc = tuple(p for p in loc if p not in ("remote", "onnxruntime", "tensorrt"))
            if any(loc[: len(path)] == path for path in unset):
                continue  # the unset variable is the cause: said once, below
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "unknown key"
            issues.append(ConfigIssue(".".join(loc), _line_of(loc, lines), msg))
        refs = reference_issues(data, lines) + semantic_issues(data, lines)
        if not (duplicates or unset_issues or issues or refs):
            # a cross-reference the raw-tree checks did not place: said without a line rather
            # than exiting on "0 error(s)" with nothing said
            refs = [ConfigIssue("", None, str(e["msg"])) for e in exc.errors()]
        raise ConfigError(source, duplicates + unset_issues + issues + refs) from None
    if duplicates or unset_issues:
        raise ConfigError(source, duplicates + unset_issues)
    return settings


def load_settings(path: str | Path, environ: Mapping[str, str] | None = None) -> Settings:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(str(p), [ConfigIssue("", None, f"cannot read: {exc.strerror}")]) from None
    except UnicodeDecodeError as exc:
        line = p.read_bytes()[: exc.start].count(b"\n") + 1
        raise ConfigError(
            str(p), [ConfigIssue("", line, f"not UTF-8 text (byte {exc.object[exc.start]:#04x})")]
        ) from None
    return parse_settings(text, str(p), environ)
