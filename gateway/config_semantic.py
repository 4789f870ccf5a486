"""Route semantic policies that cannot be right for their route, checked on the raw tree so that
check-config and `serve` say them with their path and line (gateway.config_refs), and by the
Settings validator for configs built in code. One function reads both: the raw tree and a
validated Settings dumped to plain mappings."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.config_refs import ConfigIssue, speaks_grpc
from gateway.protocols.openai import kind_of

Finding = tuple[tuple[str, ...], str]  # (path under the route, message)

_LOCAL_KINDS = ("onnxruntime", "tensorrt")


def semantic_findings(route: Mapping[str, Any], backends: Mapping[str, Any]) -> list[Finding]:
    """What is wrong with a route's cache.semantic given its protocol, path and backend."""
    cache = route.get("cache")
    sem = cache.get("semantic") if isinstance(cache, Mapping) else None
    if not isinstance(sem, Mapping):
        return []
    name = route.get("name")
    protocol = route.get("protocol", "passthrough")
    found: list[Finding] = []
    if sem.get("enabled") is True:
        backend = route.get("backend")
        spec = backends.get(backend) if isinstance(backend, str) else None
        if _local_embedder(spec):
            # Every answer of this backend is the embedding of the request's own text: a
            # semantic hit would hand a client another text's vector, wrong by construction
            # (a remote v2 model may compute anything, so it is left to the operator).
            found.append(
                (
                    ("cache", "semantic", "enabled"),
                    f"route {name!r}: backend {backend!r} is a local embedding model, and a "
                    "semantic hit would answer a text with another text's embedding; remove "
                    "cache.semantic (the exact cache still answers repeats)",
                )
            )
        elif protocol == "openai" and _embeddings_path(route.get("match")):
            # The stage never reads an embeddings call (each input's own vector is the answer):
            # the setting would do nothing, so it is not taken as if it did something.
            found.append(
                (
                    ("cache", "semantic", "enabled"),
                    f"route {name!r}: embeddings are never answered semantically (each text's "
                    "own vector is the answer); remove cache.semantic from this route",
                )
            )
    if sem.get("max_error_rate") is not None and protocol not in ("openai", "anthropic"):
        # labels compare two answers' text (cache/semantic/answer_text.py): a v2 or gRPC
        # answer is tensors, so no label would ever come and the bar never open
        found.append(
            (
                ("cache", "semantic", "max_error_rate"),
                f"route {name!r}: cache.semantic.max_error_rate needs answers the gateway can "
                f"compare, on protocol openai or anthropic; a {protocol} route's semantic cache "
                "serves at its static point (threshold, min_score): remove max_error_rate and "
                "its budget keys",
            )
        )
    judge = sem.get("judge")
    judge_backend = judge.get("backend") if isinstance(judge, Mapping) else None
    if judge_backend is not None:
        spec = backends.get(judge_backend) if isinstance(judge_backend, str) else None
        if not isinstance(spec, Mapping) or spec.get("kind") != "remote" or speaks_grpc(spec):
            found.append(
                (
                    ("cache", "semantic", "judge", "backend"),
                    f"route {name!r}: judge backend {judge_backend!r} must be a remote HTTP "
                    f"backend under backends ({', '.join(sorted(map(str, backends)))})",
                )
            )
    return found


def _local_embedder(spec: object) -> bool:
    return (
        isinstance(spec, Mapping)
        and spec.get("kind") in _LOCAL_KINDS
        and spec.get("task", "embed") == "embed"
    )


def _embeddings_path(match: object) -> bool:
    path = match.get("path") if isinstance(match, Mapping) else None
    return isinstance(path, str) and kind_of(path) == "embeddings"


def semantic_issues(data: Any, lines: dict[tuple[str, ...], int]) -> list[ConfigIssue]:
    """semantic_findings of every route of the raw tree, at their own path and line."""
    routes = data.get("routes") if isinstance(data, Mapping) else None
    backends = data.get("backends") if isinstance(data, Mapping) else None
    if not isinstance(routes, list) or not isinstance(backends, Mapping):
        return []
    issues = []
    for i, route in enumerate(routes):
        if not isinstance(route, Mapping):
            continue
        for sub, msg in semantic_findings(route, backends):
            path = ("routes", str(i), *sub)
            issues.append(ConfigIssue(".".join(path), _line(path, lines), msg))
    return issues


def _line(path: tuple[str, ...], lines: dict[tuple[str, ...], int]) -> int | None:
    # the key itself, else the nearest written parent (a flow mapping is one line anyway)
    for n in range(len(path), -1, -1):
        if path[:n] in lines:
            return lines[path[:n]]
    return None
