"""`latentgate check-config`: every error printed with its dotted path and line, non-zero exit;
the shipped config passes; `${VAR:-default}` interpolation."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from backends.settings import RemoteBackendSettings
from gateway.config import Settings, parse_settings
from tests.support.servers import ROOT

BAD = """\
listeners:
  - name: main
    host: 127.0.0.1
    port: 8080
    colour: blue
limits:
  max_body_bytes: lots
backends:
  upstream:
    kind: remote
    replicas: ["http://127.0.0.1:8000"]
routes:
  - name: chat
    match: {path: /v1/chat/completions}
    protocol: openai
    backend: upstream
  - name: rest
    match: {prefix: /}
    backend: nowhere
"""


def _check(path: Path | str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "check-config", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_every_error_with_path_and_line(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(BAD)
    out = _check(cfg)
    assert out.returncode != 0
    err = out.stderr
    assert "3 error(s)" in err, err
    assert "listeners.0.colour (line 5): unknown key" in err
    assert "limits.max_body_bytes (line 7): " in err and "integer" in err
    assert "routes.1.backend (line 19): " in err and "'nowhere'" in err


def test_missing_backend_alone_is_reported_where_it_is(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(BAD.replace("    colour: blue\n", "").replace("lots", "1000"))
    out = _check(cfg)
    assert out.returncode != 0
    assert "1 error(s)" in out.stderr
    assert "routes.1.backend (line 18): route 'rest' names backend 'nowhere'" in out.stderr


def test_shipped_config_passes() -> None:
    out = _check(ROOT / "config" / "latentgate.yaml")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith(": ok")


def test_unreadable_and_invalid_yaml(tmp_path: Path) -> None:
    assert _check(tmp_path / "missing.yaml").returncode != 0
    cfg = tmp_path / "broken.yaml"
    cfg.write_text("routes: [\n  - {name: x\n")
    out = _check(cfg)
    assert out.returncode != 0 and "not valid YAML" in out.stderr and "line" in out.stderr


def _replicas(settings: Settings) -> list[str]:
    backend = settings.backends["upstream"]
    assert isinstance(backend, RemoteBackendSettings)
    return backend.replicas


def test_interpolation_defaults_and_values() -> None:
    text = """\
listeners:
  - {host: "${LG_HOST:-127.0.0.2}", port: "${LG_PORT:-9001}"}
admin: {token: "${LG_TOKEN:-}"}
backends:
  upstream: {kind: remote, replicas: ["${LG_UP:-http://127.0.0.1:8000}"]}
routes:
  - {name: all, match: {prefix: /}, backend: upstream}
"""
    unset = parse_settings(text, environ={})
    assert unset.listeners[0].host == "127.0.0.2" and unset.listeners[0].port == 9001
    assert unset.admin.token is None  # an emptied ${VAR:-} means "not set"
    assert _replicas(unset) == ["http://127.0.0.1:8000"]
    env = {
        "LG_HOST": "0.0.0.0",
        "LG_PORT": "7000",
        "LG_TOKEN": "s3cret",
        "LG_UP": "unix:/tmp/u.sock",
    }
    given = parse_settings(text, environ=env)
    assert given.listeners[0].host == "0.0.0.0" and given.listeners[0].port == 7000
    assert given.admin.token == "s3cret"
    assert _replicas(given) == ["unix:/tmp/u.sock"]
    # Set but empty falls back to the default, as in the shell.
    assert parse_settings(text, environ={"LG_PORT": ""}).listeners[0].port == 9001


def test_version_flag_prints_the_installed_version() -> None:
    from gateway.version import version

    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "--version"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == f"latentgate {version()}"
    assert version()[0].isdigit()


def test_unset_variables_are_named_with_their_line(tmp_path: Path) -> None:
    config = tmp_path / "nope.yaml"
    config.write_text(
        """\
listeners:
  - name: main
    host: 127.0.0.1
    port: "${NOPE_PORT}"
backends:
  upstream:
    kind: remote
    replicas: ["${NOPE_UP}"]
routes:
  - {name: all, match: {prefix: /}, backend: upstream}
"""
    )
    proc = _check(config)
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    # (the third: the listener is left without a port, which it needs)
    assert lines[0].endswith("3 error(s)")
    assert "listeners.0 (line 2): a TCP listener needs a port" in proc.stderr
    # A port left empty by an unset variable is an error too, not a silent "no port".
    assert lines[1].strip().startswith("listeners.0.port (line 4): environment variable NOPE_PORT")
    assert (
        lines[2]
        .strip()
        .startswith(
            "backends.upstream.replicas.0 (line 8): environment variable NOPE_UP is not set"
        )
    )
    assert "${NOPE_UP:-default}" in lines[2]
    assert "valid string" not in proc.stderr  # the cause, not pydantic's symptom


def test_a_config_that_would_fail_at_start_fails_the_check(tmp_path: Path) -> None:
    """What `serve` would crash on (a replica port out of range, a listener without a port, a
    file that is not UTF-8) is a one-line error here, with its line, never a traceback."""
    config = tmp_path / "bad.yaml"
    config.write_bytes(
        b"listeners:\n  - {name: main, host: 127.0.0.1}\nbackends:\n"
        b'  up: {kind: remote, replicas: ["http://127.0.0.1:99999"]}\n'
        b"routes:\n  - {name: all, match: {prefix: /}, backend: up}\n"
    )
    proc = _check(config)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "listeners.0 (line 2): a TCP listener needs a port" in proc.stderr
    assert "replica 'http://127.0.0.1:99999': Port out of range" in proc.stderr
    config.write_bytes(config.read_bytes().replace(b"99999", b"9999") + b"# caf\xe9\n")
    proc = _check(config)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "(line 7): not UTF-8 text" in proc.stderr


DUPLICATES = """\
limits:
  max_body_bytes: 16777216
backends:
  upstream: {kind: remote, replicas: ["http://127.0.0.1:8000"]}
routes:
  - name: chat
    match: {path: /v1/chat/completions}
    protocol: openai
    backend: upstream
  - name: chat
    match: {prefix: /}
    backend: upstream
limits:
  max_body_bytes: 1024
"""


def test_a_key_given_twice_is_an_error_not_the_last_one_silently(tmp_path: Path) -> None:
    """YAML loaders keep the last of two equal keys: the first `limits:` block would vanish."""
    cfg = tmp_path / "dup.yaml"
    cfg.write_text(DUPLICATES)
    out = _check(cfg)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "limits (line 13): duplicate key (first given on line 1)" in out.stdout + out.stderr
    # said beside the file's other problems, not instead of them
    assert "routes.1.name (line 10)" in out.stdout + out.stderr
    # the same file without its second limits block: the route named twice is said where it is
    cfg.write_text(DUPLICATES.split("limits:\n  max_body_bytes: 1024")[0])
    out = _check(cfg)
    assert out.returncode == 1
    assert "routes.1.name (line 10): route name 'chat' is used twice (first: routes.0)" in (
        out.stdout + out.stderr
    )
    # YAML's own override (a merge key) is not a duplicate
    merged = DUPLICATES.split("limits:\n  max_body_bytes: 1024")[0]
    merged = merged.replace(
        "  - name: chat\n    match: {prefix: /}", "  - name: rest\n    match: {prefix: /}"
    )
    merged = merged.replace(
        '  upstream: {kind: remote, replicas: ["http://127.0.0.1:8000"]}',
        '  upstream: &up {kind: remote, replicas: ["http://127.0.0.1:8000"]}\n'
        '  other: {<<: *up, replicas: ["http://127.0.0.1:8001"]}',
    )
    settings = parse_settings(merged)
    assert "8001" in str(settings.backends["other"])


CLASHING = """\
listeners:
  - {name: main, host: 0.0.0.0, port: 8080}
  - {name: grpc, protocol: grpc, host: 127.0.0.1, port: 8080}
  - {name: other-host, host: 127.0.0.2, port: 9000}
  - {name: any-port, host: 127.0.0.1, port: 0}
  - {name: sock, unix: /tmp/lg.sock}
admin:
  listener: {name: admin, unix: /tmp/lg.sock}
backends:
  upstream: {kind: remote, replicas: ["http://127.0.0.1:8000"]}
routes:
  - {name: all, match: {prefix: /}, backend: upstream}
"""


def test_two_listeners_on_one_address_fail_the_check(tmp_path: Path) -> None:
    """Before: check-config said ok and serve exited 2 with "address already in use" on its own
    second listener. A wildcard host takes the port on every address; port 0 never clashes."""
    cfg = tmp_path / "clash.yaml"
    cfg.write_text(CLASHING)
    out = _check(cfg)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "2 error(s)" in out.stderr, out.stderr
    assert "listeners.1 (line 3): 127.0.0.1:8080 is also where listeners.0 listens" in out.stderr
    assert "admin.listener (line 8): unix socket /tmp/lg.sock is also where listeners.4" in (
        out.stderr
    )
    # what is fixed passes; an admin listener without a host takes every address
    fixed = CLASHING.replace("port: 8080}\n  - {name: grpc", "port: 8081}\n  - {name: grpc")
    fixed = fixed.replace("listener: {name: admin, unix: /tmp/lg.sock}", "listener: {port: 8082}")
    assert parse_settings(fixed, "fixed.yaml").admin.listener is not None
    clash = fixed.replace("listener: {port: 8082}", "listener: {port: 8081}")  # (host: any)
    assert _check_text(tmp_path, clash).returncode == 1


def _check_text(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    cfg = tmp_path / "again.yaml"
    cfg.write_text(text)
    return _check(cfg)
