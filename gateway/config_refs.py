"""Cross-references in a config file, checked on the raw tree (gateway.config): a route naming a
missing backend or an HTTP route naming a gRPC pool, a route name used twice, readiness naming
a backend that is not there. Found before the models validate, so they are reported beside
field errors with their own path and line."""

from __future__ import annotations

from collections.abc import Mapping
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
    if not isinstance(backends, dict):
        return []
    issues = readiness_issues(data, backends, lines)
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


@dataclass(frozen=True)
class ConfigIssue:
    """One problem found in a config file: where it is and what is wrong."""

    path: str
    line: int | None
    message: str

    def __str__(self) -> str:
        where = f"{self.path or '<root>'}" + (f" (line {self.line})" if self.line else "")
        return f"{where}: {self.message}"
