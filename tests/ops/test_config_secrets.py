"""Secrets the config holds stay out of what the gateway shows: /admin/config (to an admin, who
reads the settings, not the credentials in them), /readyz (to anyone) and the logs."""

from __future__ import annotations

import json

from tests.conftest import base_config
from tests.ops.conftest import ADMIN_TOKEN, http
from tests.support.servers import GatewayProcess, ServerThread, free_port

JUDGE_KEY = "judge-key-0a1b2c3d4e"
APIM_KEY = "apim-key-5f6a7b8c9d"
REDIS_PASSWORD = "redis-pass-1e2f3a4b"


def test_admin_config_readyz_and_logs_mask_the_configs_credentials(
    upstream: ServerThread,
) -> None:
    cfg = base_config(upstream.url, admin={"token": ADMIN_TOKEN})
    # a Redis nobody listens on: its URL carries the password as a query parameter, as
    # redis-py reads it
    redis_url = f"redis://127.0.0.1:{free_port()}/0?password={REDIS_PASSWORD}"
    cfg["cache"] = {"redis": {"url": redis_url}}
    judge = {
        "url": upstream.url + "/v1/chat/completions",
        "model": "judge",
        # a judge's headers are its credential, whatever they are called
        "headers": {"X-Judge-Key": JUDGE_KEY, "Ocp-Apim-Subscription-Key": APIM_KEY},
    }
    semantic = {"enabled": True, "max_error_rate": 0.05, "answer_match": "judge", "judge": judge}
    cfg["routes"][0]["cache"] = {"exact": {"enabled": True}, "semantic": semantic}
    gw = GatewayProcess(cfg).start(semantic_ready=False)  # (the settings are what is read)
    try:
        status, _, body = http(
            "GET", gw.url + "/admin/config", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
        )
        assert status == 200
        shown = json.loads(body)
        headers = shown["routes"][0]["cache"]["semantic"]["judge"]["headers"]
        assert headers == {"X-Judge-Key": "***", "Ocp-Apim-Subscription-Key": "***"}
        assert shown["cache"]["redis"]["url"].endswith("?password=***")
        for secret in (JUDGE_KEY, APIM_KEY, REDIS_PASSWORD):
            assert secret.encode() not in body
        ready = http("GET", gw.url + "/readyz")[2]  # no credentials needed to read it
        assert b"redis://127.0.0.1:" in ready
        assert REDIS_PASSWORD.encode() not in ready
    finally:
        gw.stop()
    for secret in (JUDGE_KEY, APIM_KEY, REDIS_PASSWORD):
        assert secret not in gw.log()
