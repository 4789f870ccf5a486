"""What a label compares, through the real gateway: tool-call answers, Anthropic Messages, and
sampled calls. A label is only as right as its reading of the two answers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import pytest
from aiohttp import web

from tests.conftest import base_config
from tests.integration.cache.conftest import ADMIN_TOKEN, anthropic_route
from tests.semantic.test_budget_gateway import BUDGET, PARA, Q, admin_state, metric, wait_for
from tests.semantic.test_gateway import client_for, semantic_config
from tests.support.class_upstream import build_class_upstream
from tests.support.sdk_clients import close_tracked_clients, track  # noqa: F401 (autouse)
from tests.support.servers import ServerThread

A = "Open Settings, then Security, then Reset."


@pytest.fixture
def tool_upstream(request: pytest.FixtureRequest) -> Iterator[tuple[ServerThread, dict[str, str]]]:
    answers: dict[str, str] = dict(request.param)
    server = ServerThread(lambda: build_class_upstream(answers, tools=True)).start()
    yield server, answers
    server.stop()


def tool_call(url: str, key: str, text: str) -> tuple[str, str]:
    raw = client_for(url, key).chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": text}], temperature=0
    )
    calls = raw.parse().choices[0].message.tool_calls
    assert calls is not None
    return calls[0].function.arguments, raw.headers["x-cache"]


@pytest.mark.parametrize("tool_upstream", [{Q: A, PARA: "Call support."}], indirect=True)
def test_tool_calls_with_other_arguments_are_wrong_labels(
    tool_upstream: tuple[ServerThread, dict[str, str]], start_gateway: Callable[..., ServerThread]
) -> None:
    # The answer is a tool call with no text: compared as text alone, any two would agree.
    gw = start_gateway(semantic_config(tool_upstream[0].url, **BUDGET))
    for t in range(3):
        tool_call(gw.url, f"sk-t{t}", Q)
        assert tool_call(gw.url, f"sk-t{t}", PARA)[1] == "miss"
    wait_for(lambda: admin_state(gw.url)["budget"]["labels"] == 3, "three labels")
    state = admin_state(gw.url)["budget"]
    assert state["wrong"] == 3 and not state["bar"]["open"]
    tool_call(gw.url, "sk-z", Q)
    args, cache = tool_call(gw.url, "sk-z", PARA)
    assert cache == "miss" and "Call support." in args  # its own call, not Q's


@pytest.mark.parametrize("tool_upstream", [{Q: A, PARA: A}], indirect=True)
def test_tool_calls_with_the_same_arguments_agree_and_open_the_bar(
    tool_upstream: tuple[ServerThread, dict[str, str]], start_gateway: Callable[..., ServerThread]
) -> None:
    gw = start_gateway(semantic_config(tool_upstream[0].url, **BUDGET))
    for t in range(3):
        tool_call(gw.url, f"sk-t{t}", Q)
        tool_call(gw.url, f"sk-t{t}", PARA)
    wait_for(lambda: admin_state(gw.url)["budget"]["bar"]["open"], "the bar opens")
    assert admin_state(gw.url)["budget"]["wrong"] == 0
    tool_call(gw.url, "sk-z", Q)
    args, cache = tool_call(gw.url, "sk-z", PARA)
    assert cache == "semantic-hit" and A in args


def test_messages_misses_label_and_open_the_bar(start_gateway: Callable[..., ServerThread]) -> None:
    answers = {Q: A, PARA: A}
    up = ServerThread(lambda: build_class_upstream(answers)).start()
    try:
        cfg = base_config(up.url)
        route = anthropic_route(semantic=True)
        route["cache"]["semantic"].update(BUDGET)
        cfg["routes"].insert(0, route)
        gw = start_gateway({**cfg, "admin": {"token": ADMIN_TOKEN}})

        def ask(key: str, text: str) -> tuple[str, str]:
            c = track(anthropic.Anthropic(base_url=gw.url, api_key=key, max_retries=0))
            raw = c.messages.with_raw_response.create(
                model="claude-test",
                max_tokens=64,
                messages=[{"role": "user", "content": text}],
                extra_body={"temperature": 0},
            )
            block = raw.parse().content[0]
            assert block.type == "text"
            return block.text, raw.headers["x-cache"]

        for t in range(3):
            ask(f"sk-ant-{t}", Q)
            assert ask(f"sk-ant-{t}", PARA)[1] == "miss"
        name = route["name"]
        state: Callable[[], dict[str, Any]] = lambda: admin_state(gw.url, name)["budget"]  # noqa: E731
        wait_for(lambda: state()["labels"] == 3, "three labels from Messages misses")
        assert state()["wrong"] == 0 and state()["bar"]["open"]
        ask("sk-ant-z", Q)
        assert ask("sk-ant-z", PARA) == (A, "semantic-hit")
    finally:
        up.stop()


def test_seeded_sampled_calls_give_no_exact_match_labels(
    start_gateway: Callable[..., ServerThread],
) -> None:
    # A seed makes a call repeatable, but a reworded one samples another path: its answer
    # would disagree whatever the question meant. Greedy calls still label.
    answers = {Q: A, PARA: A}
    up = ServerThread(lambda: build_class_upstream(answers)).start()
    try:
        gw = start_gateway(semantic_config(up.url, **BUDGET))
        c = client_for(gw.url, "sk-seed")
        for text in (Q, PARA):
            c.chat.completions.create(
                model="m", messages=[{"role": "user", "content": text}], temperature=1, seed=7
            )
        c = client_for(gw.url, "sk-greedy")
        for text in (Q, PARA):
            c.chat.completions.create(
                model="m", messages=[{"role": "user", "content": text}], temperature=0
            )
        wait_for(lambda: admin_state(gw.url)["budget"]["labels"] == 1, "the greedy label")
        state = admin_state(gw.url)["budget"]
        assert state["labels"] == 1 and state["lookups_with_a_candidate"] == 2
    finally:
        up.stop()


def judge_app(verdicts: list[str]) -> Callable[[], web.Application]:
    """A chat endpoint that judges: answers with the next verdict ('500': fails)."""

    def build() -> web.Application:
        async def judge(request: web.Request) -> web.Response:
            doc = await request.json()
            assert "Answer A:" in doc["messages"][0]["content"] and doc["temperature"] == 0
            verdict = verdicts[0]
            if verdict == "500":
                return web.json_response({"error": {"message": "down"}}, status=500)
            msg = {"role": "assistant", "content": verdict}
            return web.json_response({"choices": [{"index": 0, "message": msg}]})

        app = web.Application()
        app.router.add_post("/v1/chat/completions", judge)
        return app

    return build


def test_a_judge_backend_labels_answers_that_differ_and_a_failing_one_labels_nothing(
    start_gateway: Callable[..., ServerThread],
) -> None:
    verdicts = ["Yes."]
    answers = {Q: A, PARA: "Settings > Security > Reset."}  # the same answer, other words
    up = ServerThread(lambda: build_class_upstream(answers)).start()
    judge = ServerThread(judge_app(verdicts)).start()
    try:
        # the judge is one of the gateway's backends, called directly (never through a route)
        judged = {**BUDGET, "answer_match": "judge", "judge": {"backend": "judge", "model": "j"}}
        cfg = semantic_config(up.url, **judged)
        cfg["backends"]["judge"] = {"kind": "remote", "replicas": [judge.url]}
        gw = start_gateway(cfg)
        for t in range(3):
            c = client_for(gw.url, f"sk-t{t}")
            for text in (Q, PARA):
                c.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": text}], temperature=0
                )
        wait_for(lambda: admin_state(gw.url)["budget"]["bar"]["open"], "the judge's yes labels")
        assert admin_state(gw.url)["budget"]["labels_by_source"]["miss"]["agree"] == 3

        verdicts[0] = "500"  # the judge goes down: no label, and clients never notice
        for t in range(3, 5):
            c = client_for(gw.url, f"sk-t{t}")
            c.chat.completions.create(
                model="m", messages=[{"role": "user", "content": Q + " Thanks."}], temperature=0
            )
            c.chat.completions.create(
                model="m", messages=[{"role": "user", "content": PARA + " Thanks."}], temperature=0
            )
        wait_for(
            lambda: admin_state(gw.url)["budget"]["labels_by_source"]["miss"]["unusable"] >= 1,
            "an unusable label counted",
        )
        unusable = 'latentgate_semantic_labels_total{outcome="unusable",route="chat",source="miss"}'
        assert metric(gw.url, unusable) >= 1
        assert admin_state(gw.url)["budget"]["labels"] == 3  # no label from a failed verdict
    finally:
        judge.stop()
        up.stop()


@pytest.mark.parametrize("backend", ["nowhere", "embeddings_local"])
def test_a_judge_backend_must_be_a_remote_http_backend(backend: str) -> None:
    from pydantic import ValidationError

    from gateway.config import Settings

    cfg = semantic_config(
        "http://127.0.0.1:9",
        **BUDGET,
        answer_match="judge",
        judge={"backend": backend, "model": "j"},
    )
    cfg["backends"]["embeddings_local"] = {
        "kind": "onnxruntime",
        "model": "builtin:all-MiniLM-L6-v2",
    }
    with pytest.raises(ValidationError, match=f"judge backend '{backend}' must be a remote HTTP"):
        Settings.model_validate(cfg)


@pytest.mark.parametrize("protocol", ["v2", "passthrough"])
def test_a_budget_on_a_route_whose_answers_are_not_text_is_a_config_error(protocol: str) -> None:
    """Labels compare answers' text: on a v2 route no label would ever come, and the bar would
    stay shut for good with nothing said; the config says so at load instead."""
    from pydantic import ValidationError

    from gateway.config import Settings

    cfg = semantic_config("http://127.0.0.1:9", **BUDGET)
    chat = next(r for r in cfg["routes"] if r["name"] == "chat")
    chat["protocol"] = protocol
    with pytest.raises(ValidationError, match="max_error_rate needs answers the gateway can"):
        Settings.model_validate(cfg)
    chat["cache"]["semantic"] = {"enabled": True}  # the static point: fine
    Settings.model_validate(cfg)
