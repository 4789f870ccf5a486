"""`latentgate profile` against a gateway: per-stage p50/p99 from Server-Timing, and the chart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.cli import main as cli_main
from gateway.profile import parse_server_timing, percentile
from tests.support.servers import ServerThread


def test_parse_server_timing_and_percentiles() -> None:
    header = 'parse;dur=0.120, upstream;dur=3.5;desc="pool", bogus;dur=x, total;dur=4, ;dur=1'
    assert parse_server_timing(header) == {"parse": 0.12, "upstream": 3.5, "total": 4.0}
    assert parse_server_timing("") == {}
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile([7.0], 99) == 7.0


def _rows(out: str) -> dict[str, list[str]]:
    return {
        line.split()[0]: line.split() for line in out.splitlines()[2:] if line and line[0] != " "
    }


def test_profile_prints_stage_percentiles_and_plots(
    gateway: ServerThread,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    body = tmp_path / "chat.json"
    body.write_text(json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
    png = tmp_path / "profile.png"
    code = cli_main(
        [
            "profile",
            gateway.url + "/v1/chat/completions",
            "--requests",
            "40",
            "--concurrency",
            "4",
            "--body",
            str(body),
            "--plot",
            str(png),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    rows = _rows(out)
    for stage in ("parse", "upstream", "total", "client"):
        assert stage in rows, out
        assert rows[stage][1] == "40"
        p50, p99 = float(rows[stage][2]), float(rows[stage][3])
        assert 0 <= p50 <= p99
    assert "40 requests" in out and "200: 40" in out
    pytest.importorskip("matplotlib", reason="the chart needs the optional `plot` extra")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_profile_says_when_there_is_no_server_timing(
    upstream: ServerThread,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli_main(["profile", upstream.url + "/v1/models", "--requests", "5"]) == 0
    assert "no Server-Timing header" in capsys.readouterr().out
