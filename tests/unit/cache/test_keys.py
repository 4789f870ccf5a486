"""Canonical keys: same content in any key order or number form → same key; any change → new key."""

from __future__ import annotations

import json
from typing import Any

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from cache.keys import KeyBuilder, Selector, canonical
from cache.tenant import TenantHasher, tenant_of
from gateway.protocols.openai import OpenAIAdapter

HASHER = TenantHasher(b"k" * 32)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**53), max_value=2**53),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


def _shuffle_and_floatify(value: Any, rnd: Any) -> Any:
    """The same content re-serialised differently: keys reordered, integers written as floats."""
    if isinstance(value, dict):
        items = list(value.items())
        rnd.shuffle(items)
        return {k: _shuffle_and_floatify(v, rnd) for k, v in items}
    if isinstance(value, list):
        return [_shuffle_and_floatify(v, rnd) for v in value]
    if (
        isinstance(value, int)
        and not isinstance(value, bool)
        and abs(value) < 2**53
        and rnd.random() < 0.5
    ):
        return float(value)
    return value


@settings(max_examples=200, deadline=None)
@given(json_values, st.randoms(use_true_random=False))
def test_same_content_any_order_or_number_form_same_key(value: Any, rnd: Any) -> None:
    other = _shuffle_and_floatify(value, rnd)
    assert canonical(other) == canonical(value)
    # and through a real JSON text with whitespace: still the same
    assert canonical(json.loads(json.dumps(other, indent=2))) == canonical(value)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_json_and_msgpack_bodies_share_a_key(value: Any) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "extra": value}
    adapter = OpenAIAdapter()
    as_json = adapter.parse(
        "POST", "/v1/chat/completions", "", "application/json", json.dumps(body).encode()
    )
    as_msgpack = adapter.parse(
        "POST", "/v1/chat/completions", "", "application/msgpack", msgpack.packb(body)
    )
    assert as_json is not None and as_msgpack is not None
    kb = KeyBuilder("chat", [], HASHER)
    assert kb.build("m", as_json.key_fields, {}) == kb.build("m", as_msgpack.key_fields, {})


OUTPUT_FIELDS = {
    "temperature": st.floats(min_value=0, max_value=2, allow_nan=False),
    "top_p": st.floats(min_value=0, max_value=1, allow_nan=False),
    "max_tokens": st.integers(min_value=1, max_value=4096),
    "seed": st.integers(min_value=0, max_value=2**31),
    "n": st.integers(min_value=1, max_value=8),
    "stop": st.one_of(st.text(max_size=5), st.lists(st.text(max_size=5), max_size=3)),
    "tools": st.lists(
        st.fixed_dictionaries(
            {
                "type": st.just("function"),
                "function": st.fixed_dictionaries({"name": st.text(min_size=1, max_size=8)}),
            }
        ),
        max_size=2,
    ),
    "tool_choice": st.sampled_from(["auto", "none", "required"]),
    "response_format": st.sampled_from([{"type": "text"}, {"type": "json_object"}]),
    "logit_bias": st.dictionaries(
        st.integers(0, 50000).map(str), st.integers(-100, 100), max_size=3
    ),
    "messages": st.lists(
        st.fixed_dictionaries(
            {"role": st.sampled_from(["user", "system"]), "content": st.text(max_size=20)}
        ),
        min_size=1,
        max_size=3,
    ),
    "model": st.text(min_size=1, max_size=10),
}


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(OUTPUT_FIELDS)), st.data())
def test_any_changed_output_field_changes_the_key(field: str, data: Any) -> None:
    base = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "temperature": 0.5}
    a = data.draw(OUTPUT_FIELDS[field])
    b = data.draw(OUTPUT_FIELDS[field].filter(lambda v: canonical(v) != canonical(a)))
    adapter = OpenAIAdapter()
    kb = KeyBuilder("chat", [], HASHER)
    keys = []
    for v in (a, b):
        doc = {**base, field: v}
        call = adapter.parse(
            "POST", "/v1/chat/completions", "", "application/json", json.dumps(doc).encode()
        )
        assert call is not None
        keys.append(kb.build(call.model, call.key_fields, {}).value)
    assert keys[0] != keys[1]


def test_framing_and_bookkeeping_fields_do_not_change_the_key() -> None:
    adapter = OpenAIAdapter()
    kb = KeyBuilder("chat", [], HASHER)
    base = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
    variants = [
        base,
        {**base, "stream": True},
        {**base, "stream": True, "user": "u1", "stream_options": {"include_usage": True}},
    ]
    keys = set()
    for doc in variants:
        call = adapter.parse(
            "POST", "/v1/chat/completions", "", "application/json", json.dumps(doc).encode()
        )
        assert call is not None
        keys.add(kb.build(call.model, call.key_fields, {}).value)
    assert len(keys) == 1
    # without a stream, stream_options is a request the API refuses: never the plain one's key
    plain = {**base, "stream_options": {"include_usage": True}}
    call = adapter.parse(
        "POST", "/v1/chat/completions", "", "application/json", json.dumps(plain).encode()
    )
    assert call is not None and kb.build(call.model, call.key_fields, {}).value not in keys


def test_tenant_route_and_model_separate_keys_and_tenant_is_never_in_clear() -> None:
    fields = {"messages": [{"role": "user", "content": "x"}]}
    kb = KeyBuilder("chat", [], HASHER)
    a = kb.build("m", fields, {"Authorization": "Bearer sk-alice"})
    b = kb.build("m", fields, {"Authorization": "Bearer sk-bob"})
    other_route = KeyBuilder("chat2", [], HASHER).build(
        "m", fields, {"Authorization": "Bearer sk-alice"}
    )
    other_model = kb.build("m2", fields, {"Authorization": "Bearer sk-alice"})
    assert len({a.value, b.value, other_route.value, other_model.value}) == 4
    assert "sk-alice" not in a.value
    digest = a.value.split(".")[-1]
    assert len(digest) == 32  # blake2b-128
    assert Selector.of(
        tenant=tenant_of({"Authorization": "Bearer sk-alice"}), hasher=HASHER
    ).matches(a.value)
    assert not Selector.of(
        tenant=tenant_of({"Authorization": "Bearer sk-alice"}), hasher=HASHER
    ).matches(b.value)
    assert Selector.of(route="chat", model="m").matches(a.value)
    assert not Selector.of(route="chat").matches(other_route.value)


def test_bools_are_not_numbers_and_ints_are_not_strings() -> None:
    assert canonical({"a": True}) != canonical({"a": 1})
    assert canonical({"a": 1}) != canonical({"a": "1"})
    assert canonical({"a": 1.5}) != canonical({"a": 1})
    assert canonical({"a": 1.0}) == canonical({"a": 1})


def test_no_body_spells_a_digested_text_or_a_binary_value() -> None:
    """Texts over 64 KiB and msgpack bin values are keyed by a tagged digest; a client that sends
    the tag itself, with the right digest, must not get their key (and their cached answer)."""
    import hashlib

    text = "document " * 10_000
    digest = hashlib.blake2b(text.encode(), digest_size=16).hexdigest()
    assert canonical({"content": text}) != canonical({"content": {"\x00str": digest}})
    blob = b"\x01\x02"
    forged = {"\x00bin": hashlib.blake2b(blob, digest_size=16).hexdigest()}
    assert canonical({"b": blob}) != canonical({"b": forged})
    # an escaped key is still told apart from its unescaped neighbour
    assert canonical({"\x00a": 1}) != canonical({"\x00\x00a": 1})
    assert canonical({"\x00a": 1}) == canonical({"\x00a": 1.0})
