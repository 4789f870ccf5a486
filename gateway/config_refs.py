"""Cross-references in a config file, checked on the raw tree (gateway.config): a route naming a
missing backend or an HTTP route naming a gRPC pool, a route name used twice, readiness naming
a backend that is not there, two listeners on one address. Found before the models validate,
so they are reported beside field errors with their own path and line."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

BACKEND_REF = "backend_reference"


def missing_backend(route: object, backend: object, backends: Mapping[str, object]) -> str:
    return (
        f"route {route!r} names backend {backend!r}, "
        f"which is not under backends ({', '.join(sorted(backends))})"
    )


def http_to_grpc(route: object, protocol: object, backend: object) -> str:
    return (
        f"route {route!r} is {protocol} over HTTP but backend {backend!r} speaks gRPC; "
        "give the route protocol: grpc"
    )


def speaks_grpc(spec: Any) -> bool:
    replicas = spec.get("replicas") if isinstance(spec, dict) else None
    return isinstance(replicas, list) and any(
        isinstance(u, str) and u.startswith(("grpc://", "grpc+unix:")) for u in replicas
    )


def reference_issues(data: Any, lines: dict[tuple[str, ...], int]) -> list[ConfigIssue]:
    """Routes naming a missing backend, an HTTP route naming a gRPC pool, or a route name used
    twice, found on the raw tree so they are reported alongside field errors (the model
    validator only runs once every field is valid)."""
    backends = data.get("backends")
    routes = data.get("routes")
    issues = listener_issues(data, lines)
    if not isinstance(backends, dict):
        return issues
    issues += readiness_issues(data, backends, lines)
    if not isinstance(routes, list):
        return issues
    named: dict[str, int] = {}
    for i, route in enumerate(routes):
        name = route.get("name") if isinstance(route, dict) else None
        if isinstance(name, str):
            if name in named:
                path = ("routes", str(i), "name")
                msg = f"route name {name!r} is used twice (first: routes.{named[name]})"
                issues.append(ConfigIssue(".".join(path), lines.get(path), msg))
            else:
                named[name] = i
        backend = route.get("backend") if isinstance(route, dict) else None
        if isinstance(backend, str) and backend not in backends:
            path = ("routes", str(i), "backend")
            msg = missing_backend(route.get("name"), backend, backends)
            issues.append(ConfigIssue(".".join(path), lines.get(path), msg))
        elif isinstance(backend, str) and speaks_grpc(backends[backend]):
            protocol = route.get("protocol", "passthrough")
            if protocol != "grpc":
                path = ("routes", str(i), "protocol")
                msg = http_to_grpc(route.get("name"), protocol, backend)
                issues.append(ConfigIssue(".".join(path), lines.get(path), msg))
    return issues


def readiness_issues(
    data: Any, backends: dict[Any, Any], lines: dict[tuple[str, ...], int]
) -> list[ConfigIssue]:
    """readiness.require naming a backend that is not there, or a remote one without a
    health_check, at the name's own path and line."""
    readiness = data.get("readiness")
    names = readiness.get("require") if isinstance(readiness, dict) else None
    issues = []
    for i, name in enumerate(names if isinstance(names, list) else []):
        spec = backends.get(name) if isinstance(name, str) else None
        path = ("readiness", "require", str(i))
        if isinstance(name, str) and spec is None:
            msg = f"readiness.require names {name!r}, which is not under backends"
        elif (
            isinstance(spec, dict) and spec.get("kind") == "remote" and not spec.get("health_check")
        ):
            msg = (
                f"readiness.require names remote backend {name!r}: give it a health_check "
                "so its replicas are probed before any traffic"
            )
        else:
            continue
        issues.append(ConfigIssue(".".join(path), lines.get(path), msg))
    return issues


DEFAULT_LISTENER = {"host": "127.0.0.1", "port": 8080}
_ANY_HOST = (None, "", "0.0.0.0", "::")


Located = tuple[tuple[str, ...], Any]  # (path in the config tree, the raw mapping)


def listener_clashes(listeners: Sequence[Located]) -> list[tuple[tuple[str, ...], str]]:
    """Messages for listeners (path, raw mapping) that cannot both bind: one unix path twice, or
    one TCP port twice on the same host or where either takes every host (port 0, any free
    one, never clashes). Before, check-config said ok and serve exited 2 with "address already
    in use" on its own second listener."""
    seen: list[Located] = []
    out = []
    for path, spec in listeners:
        if not isinstance(spec, Mapping):
            continue
        for first, other in seen:
            if _clash(spec, other):
                where = _where(spec)
                out.append((path, f"{where} is also where {'.'.join(first)} listens"))
                break
        seen.append((path, spec))
    return out


def _where(spec: Mapping[str, Any]) -> str:
    if spec.get("unix") is not None:
        return f"unix socket {spec['unix']}"
    return f"{spec.get('host') or '*'}:{spec.get('port')}"


def _clash(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    if a.get("unix") is not None or b.get("unix") is not None:
        return a.get("unix") is not None and a.get("unix") == b.get("unix")
    port = a.get("port")
    if not isinstance(port, int) or port == 0 or port != b.get("port"):
        return False
    ha, hb = a.get("host"), b.get("host")
    return ha == hb or ha in _ANY_HOST or hb in _ANY_HOST


def listeners_of(data: Mapping[str, Any]) -> list[Located]:
    raw = data.get("listeners", [DEFAULT_LISTENER])
    found: list[Located] = []
    if isinstance(raw, list):
        found = [(("listeners", str(i)), spec) for i, spec in enumerate(raw)]
    admin = data.get("admin")
    if isinstance(admin, Mapping) and admin.get("listener") is not None:
        found.append((("admin", "listener"), admin["listener"]))
    return found


def listener_issues(data: Any, lines: dict[tuple[str, ...], int]) -> list[ConfigIssue]:
    if not isinstance(data, Mapping):
        return []
    clashes = listener_clashes(listeners_of(data))
    return [ConfigIssue(".".join(path), lines.get(path), msg) for path, msg in clashes]


@dataclass(frozen=True)
class ConfigIssue:
    """One problem found in a config file: where it is and what is wrong."""

    path: str
    line: int | None
    message: str

    def __str__(self) -> str:
        where = f"{self.path or '<root>'}" + (f" (line {self.line})" if self.line else "")
        return f"{where}: {self.message}"
