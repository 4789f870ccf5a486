"""Tenant identity: every credential header partitions the cache; hashes are keyed by a secret."""

from __future__ import annotations

import logging

import pytest
from multidict import CIMultiDict

from cache.keys import KeyBuilder
from cache.tenant import (
    SECRET_ENV,
    TenantHasher,
    credential_headers,
    identity_from_purge,
    resolve_secret,
    share_generated_secret,
    tenant_of,
)

FIELDS = {"messages": [{"role": "user", "content": "x"}]}


def _key(headers: dict[str, str], extra: list[str] | None = None, secret: bytes = b"s" * 32) -> str:
    kb = KeyBuilder("chat", extra or [], TenantHasher(secret))
    return kb.build("m", FIELDS, CIMultiDict(headers)).value


def test_every_credential_header_partitions() -> None:
    variants = [
        {},
        {"Authorization": "Bearer k1"},
        {"Authorization": "Bearer k2"},
        {"api-key": "k1"},
        {"api-key": "k2"},
        {"x-api-key": "k1"},
        {"Authorization": "Bearer k1", "OpenAI-Organization": "org-a"},
        {"Authorization": "Bearer k1", "OpenAI-Organization": "org-b"},
        {"Authorization": "Bearer k1", "OpenAI-Project": "p1"},
        {"Authorization": ""},  # an empty credential is not the same as none
    ]
    keys = [_key(h) for h in variants]
    assert len(set(keys)) == len(variants)
    # case of the header name does not matter; unrelated headers do not either
    assert _key({"API-KEY": "k1", "User-Agent": "x"}) == _key({"api-key": "k1"})


def test_route_extras_add_to_the_builtin_set() -> None:
    assert _key({"X-Tenant": "a"}) == _key({"X-Tenant": "b"})  # not configured: ignored
    assert _key({"X-Tenant": "a"}, ["X-Tenant"]) != _key({"X-Tenant": "b"}, ["X-Tenant"])
    # the extras never remove a built-in one
    a = _key({"X-Tenant": "a", "api-key": "k1"}, ["X-Tenant"])
    b = _key({"X-Tenant": "a", "api-key": "k2"}, ["X-Tenant"])
    assert a != b


def test_values_cannot_shift_into_a_neighbour() -> None:
    assert tenant_of({"api-key": "a\nx-api-key:1:b"}) != tenant_of(
        {"api-key": "a", "x-api-key": "b"}
    )
    two = CIMultiDict([("Authorization", "a"), ("Authorization", "b")])
    assert tenant_of(two) != tenant_of({"Authorization": "a"})


def test_hashes_are_keyed_and_reveal_no_credential() -> None:
    a = _key({"api-key": "sk-secret-value"}, secret=b"1" * 32)
    b = _key({"api-key": "sk-secret-value"}, secret=b"2" * 32)
    assert a != b  # another deployment's secret: another key (and tenant field)
    assert a.split(".")[2] != b.split(".")[2]
    assert "sk-secret" not in a


def test_undecodable_header_bytes_hash_without_error() -> None:
    weird = "Bearer \udcff\udcfe"  # how aiohttp keeps bytes that are not UTF-8
    assert _key({"Authorization": weird}) != _key({"Authorization": "Bearer "})


def test_purge_identity_matches_what_requests_produce() -> None:
    headers = {"Authorization": "Bearer k", "OpenAI-Organization": "o"}
    assert identity_from_purge(headers) == tenant_of(CIMultiDict(headers))
    assert identity_from_purge("Bearer k") == tenant_of({"authorization": "Bearer k"})
    assert identity_from_purge(["a"]) is None and identity_from_purge({"a": 1}) is None


def test_an_underscored_credential_header_is_its_own_tenant_and_purges_as_sent() -> None:
    """`x_api_key` reaches a CGI-style upstream as x-api-key does (tests/integration/cache/
    test_underscored_credentials.py); it counts under its own spelling, and a purge naming it
    as the client sent it finds it, beside the headers spelled as usual."""
    sent = {"X_Api_Key": "k", "Authorization": "Bearer k", "x-goog_api-key": "g"}
    assert tenant_of(CIMultiDict(sent)) not in (tenant_of({}), tenant_of({"x-api-key": "k"}))
    assert identity_from_purge(sent) == tenant_of(CIMultiDict(sent))
    assert tenant_of({"x_tenant": "t"}) == tenant_of({})  # only credential headers' spellings


def test_secret_from_config_then_env_then_generated(caplog: pytest.LogCaptureFixture) -> None:
    assert resolve_secret("c" * 20, {SECRET_ENV: "e" * 20}) == b"c" * 20
    assert resolve_secret(None, {SECRET_ENV: "e" * 20}) == b"e" * 20
    with caplog.at_level(logging.WARNING, "latentgate.cache.tenant"):
        one, two = resolve_secret(None, {}), resolve_secret(None, {})
    assert one != two and len(one) == 32
    assert "generated a random tenant secret" in caplog.text


def test_generated_secret_is_put_where_forked_workers_find_it() -> None:
    env: dict[str, str] = {}
    share_generated_secret(None, env)
    first = env[SECRET_ENV]
    share_generated_secret(None, env)  # a second call (or a worker) keeps it
    assert env[SECRET_ENV] == first and resolve_secret(None, env) == first.encode()
    configured: dict[str, str] = {}
    share_generated_secret("from-config-secret", configured)
    assert configured == {}


def test_identity_is_the_same_from_a_multidict_a_dict_and_resolved_names() -> None:
    """The hot path resolves the header names once and skips absent ones; the identity (and so
    every key and alias) must not depend on which way it was computed."""
    pairs = [
        ("Host", "gw"),
        ("Authorization", "Bearer k"),
        ("API-KEY", "a"),
        ("api-key", "b"),
        ("X-Tenant", "t1"),
    ]
    extra = ["X-Tenant", "anthropic-version"]
    multi = CIMultiDict(pairs)
    want = "api-key:1:a\napi-key:1:b\nauthorization:8:Bearer k\nx-tenant:2:t1"
    assert tenant_of(multi, extra) == want
    assert tenant_of(multi, credential_headers(extra), resolved=True) == want
    assert tenant_of(dict(pairs), extra) == want
    assert tenant_of(CIMultiDict([("Host", "gw")]), extra) == ""
