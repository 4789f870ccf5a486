"""The error budget is held in each tenant's own traffic (cache.semantic.tenant_guard), through
the real gateway and the OpenAI client: a route's bar proven by other tenants' labels does not
serve a tenant whose own labels say its paraphrases are answered differently."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from gateway.app import build_app
from gateway.config import Settings
from tests.semantic.test_budget_gateway import BUDGET, admin_state, metric, wait_for
from tests.semantic.test_gateway import ask, client_for, semantic_config
from tests.support.servers import RedisServer, ServerThread

Q, PARA = "How do I reset my password?", "How can I reset my password?"
ANSWER = "Open Settings, then Security, then Reset."
# The bad tenant's own questions and paraphrases, each answered differently by its upstream
# (another product, say); all of them, and Q/PARA, score in the same cell of the route's grid
# (cosine >= 0.99, score 0.55-0.60), so the route's bar serves them all or none.
BAD = [
    ("How do I cancel my subscription?", "How can I cancel my subscription?"),
    ("How do I export my data?", "How can I export my data?"),
    ("How do I contact customer support?", "How can I contact customer support?"),
]
GUARDED = 'latentgate_semantic_guarded_tenants{route="chat"}'
# as test_budget_gateway's, at a budget three wrong labels of three refute
TIGHT = {**BUDGET, "max_error_rate": 0.3}


@pytest.mark.parametrize("guard", [True, False])
def test_a_tenant_whose_own_labels_refute_the_bar_is_not_served_by_it(
    class_upstream: ServerThread,
    answers: dict[str, str],
    start_gateway: Callable[..., ServerThread],
    guard: bool,
) -> None:
    """With `tenant_guard: false` the same tenant is served at the pooled bar, as before."""
    gw = start_gateway(semantic_config(class_upstream.url, **TIGHT, tenant_guard=guard))
    bad = client_for(gw.url, "sk-bad")
    for i, (q, para) in enumerate(BAD):
        answers[q], answers[para] = f"answer {i}", f"another answer {i}"
        assert ask(bad, q, temperature=0)[1]["x-cache"] == "miss"
        assert ask(bad, para, temperature=0)[1]["x-cache"] == "miss"  # labelled: disagree
    wait_for(
        lambda: admin_state(gw.url)["budget"]["labels_by_source"]["miss"]["disagree"] == 3,
        "three wrong labels",
    )
    # refuted by its first two (2 of 2 wrong: over 0.3 at 95 %), the bad tenant is kept apart
    # while the route is still closed: its third label is its own, and with the guard off the
    # route's counts take all three
    assert admin_state(gw.url)["budget"]["wrong"] == (2 if guard else 3)

    # Other tenants' paraphrases agree: the route's bar opens on their labels.
    answers[Q] = answers[PARA] = ANSWER
    for t in range(60):
        c = client_for(gw.url, f"sk-t{t}")
        ask(c, Q, temperature=0)
        if ask(c, PARA, temperature=0)[1]["x-cache"] == "semantic-hit":
            break
    wait_for(lambda: admin_state(gw.url)["budget"]["bar"]["open"], "the route's bar opens")
    newcomer = client_for(gw.url, "sk-new")
    ask(newcomer, Q, temperature=0)
    text, h = ask(newcomer, PARA, temperature=0)
    assert h["x-cache"] == "semantic-hit" and text == ANSWER

    # The bad tenant's own labels in the bar's region refute it: no semantic hit for it.
    state = admin_state(gw.url)["budget"]
    pooled, misses = state["labels"], state["labels_by_source"]["miss"]["agree"]
    ask(bad, Q, temperature=0)
    text, h = ask(bad, PARA, temperature=0)
    if not guard:
        assert h["x-cache"] == "semantic-hit"
        assert admin_state(gw.url)["budget"]["guarded_tenants"] == []
        return
    assert h["x-cache"] == "miss" and text == ANSWER
    guarded = admin_state(gw.url)["budget"]["guarded_tenants"]
    assert len(guarded) == 1 and guarded[0]["wrong"] == 3, guarded
    assert guarded[0]["error_lower_bound"] > 0.3
    assert metric(gw.url, GUARDED) == 1
    # that miss's label (it agrees) speaks for the bad tenant alone: the route's counts, which
    # describe the hits it serves, do not take it
    wait_for(
        lambda: admin_state(gw.url)["budget"]["labels_by_source"]["miss"]["agree"] == misses + 1,
        "the guarded miss's label",
    )
    assert admin_state(gw.url)["budget"]["labels"] == pooled


@pytest.mark.slow  # two gateways, each loading the embedder
def test_a_tenant_refuted_at_one_gateway_is_kept_apart_at_another_on_the_same_redis(
    class_upstream: ServerThread, answers: dict[str, str], redis_server: RedisServer
) -> None:
    """The guards share each tenant's labels through Redis (cache.semantic.tenant_labels): B
    lists the tenant A's labels refute, and puts it in Prometheus, without seeing its traffic."""
    cfg = semantic_config(class_upstream.url, redis_server.url, **TIGHT)
    cfg["cache"]["redis"]["key_prefix"] = f"tg{uuid.uuid4().hex[:8]}:"
    settings = Settings.model_validate(cfg)
    a = ServerThread(lambda: build_app(settings)).start()
    b = ServerThread(lambda: build_app(settings)).start()
    try:
        bad = client_for(a.url, "sk-bad")
        for i, (q, para) in enumerate(BAD):
            answers[q], answers[para] = f"answer {i}", f"another answer {i}"
            ask(bad, q, temperature=0)
            ask(bad, para, temperature=0)  # labelled at A: disagree
        wait_for(lambda: len(admin_state(a.url)["budget"]["guarded_tenants"]) == 1, "A refutes")
        wait_for(lambda: len(admin_state(b.url)["budget"]["guarded_tenants"]) == 1, "B hears")
        # B may hear the verdict before A's last label reaches it (2 labels where A has 3):
        # the same counts follow within the sync's interval
        wait_for(
            lambda: (
                admin_state(b.url)["budget"]["guarded_tenants"]
                == admin_state(a.url)["budget"]["guarded_tenants"]
            ),
            "B has A's counts",
        )
        assert metric(b.url, GUARDED) == 1
        # B made no label itself: the verdict is A's evidence
        assert admin_state(b.url)["budget"]["labels_by_source"]["miss"]["disagree"] == 0
    finally:
        a.stop()
        b.stop()
