"""A config whose YAML aliases make it infinite (an alias inside the node it names) or huge
(aliases of aliases) is a config error like any other: `check-config` says so and exits 1, and a
reload answers 422 while the running config keeps serving. Before, check-config died with a
RecursionError traceback (or ran for ever on the nested aliases), and POST /admin/reload
answered 500."""

from __future__ import annotations

from pathlib import Path

import yaml

from gateway.app import build_app
from gateway.config import load_settings
from tests.conftest import base_config
from tests.integration.test_check_config import _check
from tests.ops.conftest import ADMIN_TOKEN, http, http_json
from tests.support.servers import ServerThread

RECURSIVE = "x-loop: &a [*a]\n"
# ten levels of ten aliases each: 10**10 values once expanded, a few hundred bytes on disk
NESTED = "".join(
    f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}" if i else "x"] * 10) + "]\n" for i in range(10)
)


def test_check_config_reports_a_self_referencing_alias(tmp_path: Path) -> None:
    cfg = tmp_path / "loop.yaml"
    cfg.write_text(RECURSIVE)
    out = _check(cfg)
    assert out.returncode == 1
    assert "(line 1): a YAML alias refers to a node that contains it" in out.stderr
    assert "Traceback" not in out.stderr


def test_check_config_reports_aliases_that_expand_without_bound(tmp_path: Path) -> None:
    cfg = tmp_path / "nested.yaml"
    cfg.write_text(NESTED)
    out = _check(cfg)
    assert out.returncode == 1
    assert "YAML aliases expand this document past 100,000 values" in out.stderr


def test_check_config_still_takes_ordinary_aliases(tmp_path: Path) -> None:
    cfg = tmp_path / "aliases.yaml"
    cfg.write_text(
        "backends:\n"
        "  a: {kind: remote, replicas: ['http://127.0.0.1:1'], timeouts: &t {connect: 2}}\n"
        "  b: {kind: remote, replicas: ['http://127.0.0.1:2'], timeouts: {<<: *t, read: 5}}\n"
        "routes: [{name: r, match: {prefix: /}, backend: a, protocol: passthrough}]\n"
    )
    out = _check(cfg)
    assert out.returncode == 0, out.stderr


def test_a_reload_of_a_self_referencing_alias_is_a_422_and_the_old_config_serves(
    upstream: ServerThread, tmp_path: Path
) -> None:
    path = tmp_path / "gw.yaml"
    cfg = base_config(upstream.url, admin={"token": ADMIN_TOKEN})
    path.write_text(yaml.safe_dump(cfg))
    settings = load_settings(path)
    server = ServerThread(lambda: build_app(settings, config_path=str(path))).start()
    try:
        auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        for bad in (RECURSIVE, NESTED):
            path.write_text(yaml.safe_dump(cfg) + bad)
            status, body = http_json("POST", server.url + "/admin/reload", headers=auth)
            assert status == 422, body
            assert body["ok"] is False and body["generation"] == 0
            assert "YAML alias" in body["errors"][0]["message"]
        assert http("GET", server.url + "/v1/models")[0] == 200
    finally:
        server.stop()
