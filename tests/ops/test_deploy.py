"""deploy/ works as written: every file parses, the k8s pod agrees with the config beside it (and
that config serves its probes for real), compose and systemd agree with the gateway, and every
metric the Grafana dashboard queries is one a running gateway exports."""

from __future__ import annotations

import configparser
import json
import os
import re
import socket
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from backends.settings import RemoteBackendSettings
from gateway.cli import main as cli_main
from gateway.config import Settings, load_settings
from tests.conftest import base_config
from tests.ops.conftest import http
from tests.support.servers import ROOT, GatewayProcess, ServerThread, free_port, wait_port

DEPLOY = ROOT / "deploy"
PROBE_PATHS = {"/healthz", "/readyz"}


def _load_all(path: Path) -> list[Any]:
    if path.suffix == ".json":
        return [json.loads(path.read_text())]
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def test_every_deploy_file_parses() -> None:
    files = [p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml", ".json")]
    assert len(files) >= 5
    for path in files:
        assert _load_all(path), f"{path} is empty"


def _pod() -> dict[str, Any]:
    docs = _load_all(DEPLOY / "k8s" / "pod.yaml")
    (pod,) = [d for d in docs if d.get("kind") == "Pod"]
    assert isinstance(pod, dict)
    return pod


def _sidecar(pod: dict[str, Any]) -> dict[str, Any]:
    every = pod["spec"].get("initContainers", []) + pod["spec"]["containers"]
    (gw,) = [c for c in every if c["name"] == "latentgate"]
    assert isinstance(gw, dict)
    return gw


def _pod_environ(container: dict[str, Any]) -> dict[str, str]:
    # Secret references resolve in the cluster; any non-empty value stands in for them here.
    return {e["name"]: e.get("value", "from-secret") for e in container.get("env", [])}


def _k8s_settings(pod: dict[str, Any]) -> Settings:
    gw = _sidecar(pod)
    args = gw["args"]
    config_path = Path(args[args.index("--config") + 1])
    mounts = {m["mountPath"]: m["name"] for m in gw["volumeMounts"]}
    assert mounts.get(str(config_path.parent)) == "latentgate-config"
    return load_settings(DEPLOY / "k8s" / config_path.name, environ=_pod_environ(gw))


def test_k8s_pod_agrees_with_its_config() -> None:
    pod = _pod()
    gw = _sidecar(pod)
    settings = _k8s_settings(pod)
    # Native sidecar: an init container that keeps running beside the app.
    assert gw.get("restartPolicy") == "Always"
    ports = {p["name"]: p["containerPort"] for p in gw["ports"]}
    tcp_ports = {lst.port for lst in settings.listeners if lst.port is not None}
    for probe_name, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        probe = gw[probe_name]["httpGet"]
        assert probe["path"] == path
        port = ports.get(probe["port"], probe["port"])
        assert port in tcp_ports, f"{probe_name} targets {port}, the config listens on {tcp_ports}"
    # The unix socket lives in the emptyDir that both containers mount at the same path.
    (sock,) = [lst.unix for lst in settings.listeners if lst.unix]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    sock_dir = str(Path(sock).parent)
    gw_mounts = {m["mountPath"]: m["name"] for m in gw["volumeMounts"]}
    assert "emptyDir" in volumes[gw_mounts[sock_dir]]
    (app,) = [c for c in pod["spec"]["containers"] if c["name"] == "app"]
    assert {m["mountPath"]: m["name"] for m in app["volumeMounts"]}[sock_dir] == gw_mounts[sock_dir]
    assert _pod_environ(app)["LATENTGATE_SOCKET"] == sock
    # Drain: preStop + the gateway's grace fit inside the pod's termination grace period.
    pre = gw["lifecycle"]["preStop"]["exec"]["command"]
    pre_s = float(re.search(r"sleep\((\d+(?:\.\d+)?)\)", " ".join(pre)).group(1))  # type: ignore[union-attr]
    assert pre_s + settings.limits.shutdown_grace_s < pod["spec"]["terminationGracePeriodSeconds"]
    assert {"requests", "limits"} <= set(gw["resources"])
    # The admin API stays on pod-local loopback, away from the probe port.
    assert settings.admin.listener is not None and settings.admin.listener.host == "127.0.0.1"
    assert settings.admin.listener.port not in tcp_ports


def test_k8s_config_passes_check_config(capsys: Any) -> None:
    assert cli_main(["check-config", str(DEPLOY / "k8s" / "latentgate.yaml")]) == 0
    assert cli_main(["check-config", str(DEPLOY / "compose" / "latentgate.yaml")]) == 0


def test_k8s_config_serves_probes_and_the_socket(upstream: ServerThread, tmp_sock_dir: str) -> None:
    """Run the shipped k8s config as the pod would, with only its env variables changed."""
    sock = os.path.join(tmp_sock_dir, "gateway.sock")
    port, admin_port = free_port(), free_port()
    env = {
        **os.environ,
        "LATENTGATE_SOCKET": sock,
        "LATENTGATE_PORT": str(port),
        "LATENTGATE_ADMIN_PORT": str(admin_port),
        "LATENTGATE_UPSTREAM": upstream.url,
        "LATENTGATE_ADMIN_TOKEN": "k8s-token-123456",
        "PYTHONUNBUFFERED": "1",
    }
    import subprocess
    import sys

    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gateway",
            "serve",
            "--config",
            str(DEPLOY / "k8s" / "latentgate.yaml"),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_port("127.0.0.1", port, 60)
        for path in PROBE_PATHS:
            status, _, _ = http("GET", f"http://127.0.0.1:{port}{path}")
            assert status == 200, path
        # The app container's path: chat over the unix socket.
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(10)
            s.connect(sock)
            body = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'
            s.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: latentgate\r\n"
                b"Content-Type: application/json\r\nConnection: close\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        assert data.startswith(b"HTTP/1.1 200"), data[:200]
        # Admin answers on its loopback listener only.
        auth = {"Authorization": "Bearer k8s-token-123456"}
        assert http("GET", f"http://127.0.0.1:{admin_port}/admin/config", headers=auth)[0] == 200
        assert http("GET", f"http://127.0.0.1:{port}/admin/config", headers=auth)[0] == 404
    finally:
        proc.terminate()
        out = proc.communicate(timeout=30)[0].decode(errors="replace")
    assert proc.returncode == 0, out
    assert "k8s-token-123456" not in out


def test_compose_wires_the_gateway_to_redis_and_the_model() -> None:
    (compose,) = _load_all(DEPLOY / "compose" / "compose.yaml")
    services = compose["services"]
    assert {"redis", "model", "latentgate"} <= set(services)
    gw = services["latentgate"]
    env = {k: str(v) for k, v in gw["environment"].items()}
    settings = load_settings(DEPLOY / "compose" / "latentgate.yaml", environ=env)
    redis = settings.cache.redis
    assert redis is not None and (redis.url or "").startswith("redis://redis:")
    model = settings.backends["model"]
    assert isinstance(model, RemoteBackendSettings)
    (replica,) = model.replicas
    model_port = re.search(r"--port (\d+)", " ".join(services["model"]["command"]))
    assert model_port is not None and replica == f"http://model:{model_port.group(1)}"
    published = {int(p.split(":")[1]) for p in gw["ports"]}
    assert published <= {lst.port for lst in settings.listeners}
    assert gw["build"]["dockerfile"] == "Dockerfile"
    assert (DEPLOY / "compose" / gw["build"]["context"] / "Dockerfile").exists()
    assert set(gw["depends_on"]) == {"redis", "model"}


def test_cluster_compose_runs_the_gateway_in_cluster_mode_on_every_node() -> None:
    (compose,) = _load_all(DEPLOY / "compose" / "cluster-compose.yaml")
    services = compose["services"]
    nodes = {n for n in services if n.startswith("redis-")}
    assert len(nodes) == 6
    init = " ".join(services["cluster-init"]["command"])
    assert "--cluster-replicas 1" in init and all(f"{n}:6379" in init for n in nodes)
    gw = services["latentgate"]
    env = {k: str(v) for k, v in gw["environment"].items()}
    redis = load_settings(DEPLOY / "compose" / "latentgate.yaml", environ=env).cache.redis
    assert redis is not None and redis.mode == "cluster"
    from cache.redis_client import parse_hosts

    hosts, _ = parse_hosts(redis.url or "")
    assert {h for h, _ in hosts} == nodes
    assert gw["depends_on"]["cluster-init"]["condition"] == "service_completed_successfully"


def test_systemd_unit_reloads_with_sighup_and_outlasts_the_drain() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment, method-assign]
    unit.read(DEPLOY / "systemd" / "latentgate.service")
    svc = unit["Service"]
    assert "latentgate serve --config" in svc["ExecStart"]
    assert svc["ExecReload"].endswith("kill -HUP $MAINPID")
    assert svc["KillSignal"] == "SIGTERM"
    default_grace = load_settings(ROOT / "config" / "latentgate.yaml").limits.shutdown_grace_s
    assert float(svc["TimeoutStopSec"]) > default_grace
    assert svc["User"] != "root"


def _dashboard_metrics() -> set[str]:
    dash = json.loads((DEPLOY / "grafana" / "latentgate-dashboard.json").read_text())
    names: set[str] = set()
    for panel in dash["panels"]:
        for target in panel["targets"]:
            names.update(re.findall(r"\blatentgate_[a-z0-9_]+", target["expr"]))
    return names


def test_dashboard_queries_only_exported_metrics(
    upstream: ServerThread,
    gateway_process: Callable[..., GatewayProcess],
) -> None:
    cfg = base_config(upstream.url)
    cfg["backends"]["upstream"]["timeouts"] = {"connect": 1, "read": 0.5, "total": 5}
    cfg["admin"] = {"token": "dash-token-1234"}
    for route in cfg["routes"]:
        if route["name"] == "chat":  # the exact cache on, so its series exist
            route["cache"] = {"exact": {"enabled": True, "tiers": ["memory"]}}
    gw = gateway_process(cfg)
    chat = json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}
    ).encode()
    for _ in range(3):
        http("POST", gw.url + "/v1/chat/completions", chat, {"Content-Type": "application/json"})
    # An upstream timeout (an uncached body), so the error series exist as in production.
    http(
        "POST",
        gw.url + "/v1/chat/completions",
        chat.replace(b"hi", b"slow"),
        {"Content-Type": "application/json", "X-Test-Delay": "1"},
    )
    http("POST", gw.url + "/admin/reload", b"", {"Authorization": "Bearer dash-token-1234"})
    with urllib.request.urlopen(gw.url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    exported = {
        line.split("{")[0].split(" ")[0]
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    wanted = _dashboard_metrics()
    assert wanted, "the dashboard queries no latentgate_ metric"
    missing = sorted(wanted - exported)
    assert not missing, f"dashboard queries metrics the gateway does not export: {missing}"
