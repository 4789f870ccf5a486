"""Start and stop the systems the proxy benchmark compares: an nginx upstream answering a fixed
chat.completion, an nginx keep-alive reverse proxy, the bare aiohttp proxy, LiteLLM's proxy (in its
own cached venv) and latentgate itself. Every one is a real process on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.servers import self_connected


def require_tools(*names: str) -> None:
    """Exit with one line naming what to install when a tool a bench runs is not on PATH (the
    project installs none of them: a traceback from deep in a run said less)."""
    missing = [n for n in names if shutil.which(n) is None]
    if missing:
        sys.exit(
            f"this bench needs {', '.join(missing)} on PATH; on Debian or Ubuntu: "
            "apt-get install wrk nginx-light"
        )


ROOT = Path(__file__).resolve().parents[1]
LITELLM_VERSION = "1.106.2"
MASTER_KEY = "sk-bench-master-key-0123456789"
CHAT = {
    "id": "chatcmpl-bench",
    "object": "chat.completion",
    "created": 1700000000,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello! How can I help?"},
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before opening port {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
                if not self_connected(sock):
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"port {port} did not open within {timeout}s")


@dataclass
class Target:
    name: str
    port: int
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    extra: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def cpu_seconds(self) -> float:
        """User + system CPU of the process and its descendants (nginx workers, uvicorn workers)."""
        if self.proc is None:
            return 0.0
        total, todo = 0, [self.proc.pid]
        while todo:
            pid = todo.pop()
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])
                for tid in os.listdir(f"/proc/{pid}/task"):
                    with open(f"/proc/{pid}/task/{tid}/children") as f:
                        todo.extend(int(x) for x in f.read().split())
            except (FileNotFoundError, ProcessLookupError):
                continue
        return total / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        for p in [self.proc, *self.extra]:
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)


def _spawn(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with open(log, "wb") as f:
        return subprocess.Popen(
            cmd,
            stdout=f,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )


def _nginx_conf(tmp: Path, name: str, server: str) -> Path:
    for d in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (tmp / d).mkdir(exist_ok=True)
    user = "user root;\n" if os.geteuid() == 0 else ""
    conf = tmp / f"{name}.conf"
    conf.write_text(f"""{user}worker_processes 1;
daemon off;
pid {tmp}/{name}.pid;
error_log {tmp}/{name}-error.log error;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  keepalive_requests 10000000;
  client_body_temp_path {tmp}/body; proxy_temp_path {tmp}/proxy;
  fastcgi_temp_path {tmp}/fastcgi; uwsgi_temp_path {tmp}/uwsgi; scgi_temp_path {tmp}/scgi;
{server}
}}
""")
    return conf


def start_nginx_upstream(tmp: Path) -> Target:
    port = free_port()
    body = json.dumps(CHAT, separators=(",", ":"))
    conf = _nginx_conf(
        tmp,
        "upstream",
        f"""  server {{
    listen 127.0.0.1:{port};
    location / {{ default_type application/json; return 200 '{body}'; }}
  }}""",
    )
    proc = _spawn(
        ["nginx", "-p", str(tmp), "-e", f"{tmp}/upstream-error.log", "-c", str(conf)],
        tmp / "upstream.log",
    )
    wait_port(port, 10, proc)
    return Target("direct upstream (nginx)", port, proc, tmp / "upstream-error.log")


def start_nginx_proxy(tmp: Path, upstream: int) -> Target:
    port = free_port()
    conf = _nginx_conf(
        tmp,
        "proxy",
        f"""  upstream up {{ server 127.0.0.1:{upstream}; keepalive 64; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection "";
    }}
  }}""",
    )
    proc = _spawn(
        ["nginx", "-p", str(tmp), "-e", f"{tmp}/proxy-error.log", "-c", str(conf)],
        tmp / "proxy.log",
    )
    wait_port(port, 10, proc)
    return Target("nginx keep-alive proxy", port, proc, tmp / "proxy-error.log")


def start_nginx_post_cache(tmp: Path, upstream: int) -> Target:
    """nginx proxy_cache for POST, keyed on method, URI and body: nginx's exact-hit floor."""
    port = free_port()
    (tmp / "cache").mkdir(exist_ok=True)
    conf = _nginx_conf(
        tmp,
        "postcache",
        f"""  proxy_cache_path {tmp}/cache levels=1:2 keys_zone=lg:10m max_size=100m inactive=60m
                   use_temp_path=off;
  upstream up {{ server 127.0.0.1:{upstream}; keepalive 64; }}
  server {{
    listen 127.0.0.1:{port};
    client_body_buffer_size 64k;
    location / {{
      proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection "";
      proxy_cache lg; proxy_cache_methods POST;
      proxy_cache_key "$request_method|$request_uri|$request_body";
      proxy_cache_valid 200 10m; proxy_cache_lock on;
      add_header X-Cache-Status $upstream_cache_status;
    }}
  }}""",
    )
    proc = _spawn(
        ["nginx", "-p", str(tmp), "-e", f"{tmp}/postcache-error.log", "-c", str(conf)],
        tmp / "postcache.log",
    )
    wait_port(port, 10, proc)
    return Target("nginx POST cache hit", port, proc, tmp / "postcache-error.log")


def start_dict_floor(tmp: Path) -> Target:
    """bench/dict_floor.py answering the upstream's chat body from a dict: Python's hit floor."""
    port = free_port()
    log = tmp / "dict.log"
    answer = json.dumps(CHAT, separators=(",", ":"))
    proc = _spawn([sys.executable, str(ROOT / "bench" / "dict_floor.py"), str(port), answer], log)
    wait_port(port, 30, proc)
    return Target("aiohttp+uvloop dict lookup", port, proc, log)


def start_latentgate_default(tmp: Path, upstream: int) -> Target:
    """latentgate on the unchanged default config (config/latentgate.yaml), one worker."""
    port, admin = free_port(), free_port()
    log = tmp / "latentgate-default.log"
    env = {
        "LATENTGATE_UPSTREAM": f"http://127.0.0.1:{upstream}",
        "LATENTGATE_PORT": str(port),
        "LATENTGATE_ADMIN_PORT": str(admin),
        "LATENTGATE_REDIS_URL": "",
    }
    config = str(ROOT / "config" / "latentgate.yaml")
    proc = _spawn(
        [sys.executable, "-m", "gateway", "serve", "--config", config, "--workers", "1"], log, env
    )
    wait_port(port, 120, proc)
    return Target("latentgate (default config, 1 worker)", port, proc, log)


def start_bare(tmp: Path, upstream: int) -> Target:
    port = free_port()
    log = tmp / "bare.log"
    proc = _spawn(
        [
            sys.executable,
            str(ROOT / "bench" / "bare_proxy.py"),
            str(port),
            f"http://127.0.0.1:{upstream}",
        ],
        log,
    )
    wait_port(port, 30, proc)
    return Target("bare aiohttp+uvloop proxy", port, proc, log)


def start_latentgate(tmp: Path, upstream: int) -> Target:
    port = free_port()
    up = f"http://127.0.0.1:{upstream}"
    route = [
        ("chat", "/v1/chat/completions"),
        ("completions", "/v1/completions"),
        ("embeddings", "/v1/embeddings"),
    ]
    cfg = {
        "listeners": [{"name": "main", "host": "127.0.0.1", "port": port}],
        "logging": {"level": "warning"},
        "backends": {
            "upstream": {
                "kind": "remote",
                "replicas": [up],
                "pool": {"max_connections": 256, "keepalive_s": 60},
            }
        },
        "routes": [
            *(
                {
                    "name": n,
                    "match": {"path": p, "methods": ["POST"]},
                    "protocol": "openai",
                    "backend": "upstream",
                }
                for n, p in route
            ),
            {
                "name": "default",
                "match": {"prefix": "/"},
                "protocol": "passthrough",
                "backend": "upstream",
            },
        ],
    }
    conf = tmp / "latentgate.json"  # JSON is YAML
    conf.write_text(json.dumps(cfg))
    log = tmp / "latentgate.log"
    proc = _spawn(
        [sys.executable, "-m", "gateway", "serve", "--config", str(conf), "--workers", "1"], log
    )
    wait_port(port, 60, proc)
    return Target("latentgate (1 worker)", port, proc, log)


def litellm_venv(cache: Path) -> Path:
    """LiteLLM in its own venv under the cache dir (made once; torch CPU first, as in the repo)."""
    venv = cache / "litellm-venv"
    stamp = venv / f".installed-{LITELLM_VERSION}"
    if not stamp.exists():
        cache.mkdir(parents=True, exist_ok=True)
        print(
            f"installing litellm[proxy]=={LITELLM_VERSION} into {venv} (a few minutes, once)",
            file=sys.stderr,
        )
        py = venv / "bin" / "python"
        if not py.exists():
            subprocess.run(["python3", "-m", "venv", str(venv)], check=True)
        pip = [str(py), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, "--upgrade", "pip"], check=True)
        subprocess.run([*pip, "torch==2.13.0"], check=True)
        subprocess.run([*pip, f"litellm[proxy]=={LITELLM_VERSION}"], check=True)
        stamp.touch()
    return venv


def start_litellm(tmp: Path, upstream: int, cache: Path) -> Target:
    venv = litellm_venv(cache)
    port = free_port()
    conf = tmp / "litellm.yaml"
    conf.write_text(
        json.dumps(
            {
                "model_list": [
                    {
                        "model_name": "m",
                        "litellm_params": {
                            "model": "openai/m",
                            "api_base": f"http://127.0.0.1:{upstream}/v1",
                            "api_key": "sk-fake",
                        },
                    }
                ],
                "general_settings": {"master_key": MASTER_KEY},
            }
        )
    )
    log = tmp / "litellm.log"
    proc = _spawn(
        [
            str(venv / "bin" / "litellm"),
            "--config",
            str(conf),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--num_workers",
            "1",
        ],
        log,
        env={"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"},
    )
    try:
        wait_port(port, 300, proc)
    except (RuntimeError, TimeoutError):
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError("LiteLLM did not start:\n" + tail) from None
    target = Target(f"LiteLLM proxy {LITELLM_VERSION} (1 worker)", port, proc, log)
    return target


def post_once(port: int, body: str, auth: str) -> int:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=body.encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {auth}"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        resp.read()
        return int(resp.status)
