"""A Redis URL the client cannot use (another scheme, a port that is not a number) is a config
error: `check-config` names it and exits 1, and `serve` exits 2 with the same line. Before,
check-config said "ok" and `serve` died at start with redis-py's ValueError traceback, so a unit
whose ExecStartPre runs check-config failed to start again and again."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.servers import ROOT

CONFIG = """\
backends: {{upstream: {{kind: remote, replicas: ["http://127.0.0.1:9"]}}}}
routes: [{{name: all, match: {{prefix: /}}, backend: upstream, protocol: passthrough}}]
cache: {{redis: {{url: "{url}", mode: {mode}}}}}
"""


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("url", "mode", "said"),
    [
        ("http://127.0.0.1:6379", "standalone", "redis url must start with redis://"),
        ("127.0.0.1:6379", "standalone", "not no scheme"),
        ("redis://127.0.0.1:port/0", "standalone", "redis url does not parse"),
        ("unix:///run/redis.sock", "cluster", "in cluster mode, not unix://"),
        ("redis://s1:26379,s2:x/0", "sentinel", "redis url does not parse"),
    ],
)
def test_an_unusable_redis_url_is_a_config_error(
    tmp_path: Path, url: str, mode: str, said: str
) -> None:
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(CONFIG.format(url=url, mode=mode))
    checked = _run("check-config", str(cfg))
    assert checked.returncode == 1, checked.stdout
    assert "cache.redis (line 3): " in checked.stderr and said in checked.stderr
    served = _run("serve", "--config", str(cfg), "--port", "0")
    assert served.returncode == 2
    assert said in served.stderr and "Traceback" not in served.stderr


@pytest.mark.parametrize(
    ("url", "mode"),
    [
        ("redis://:secret@127.0.0.1:6379/1", "standalone"),
        ("rediss://127.0.0.1:6380", "standalone"),
        ("unix:///run/redis.sock", "standalone"),
        ("redis://h1:7000,h2:7001", "cluster"),
        ("redis://s1:26379,s2:26379/0", "sentinel"),
    ],
)
def test_usable_redis_urls_pass(tmp_path: Path, url: str, mode: str) -> None:
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(CONFIG.format(url=url, mode=mode))
    checked = _run("check-config", str(cfg))
    assert checked.returncode == 0, checked.stderr
