"""Listener settings → aiohttp sites: TCP (SO_REUSEPORT with workers) and unix sockets."""

from __future__ import annotations

import os
import socket
import stat

from aiohttp import web

from gateway.config import ListenerSettings


class CannotListen(Exception):
    """A listener could not bind (its port taken, its socket path not writable): said in one
    line, and the process exits 2, instead of a traceback."""


def bind_unix(path: str, name: str = "uds") -> socket.socket:
    """Bind a unix socket, replacing a stale one a crashed process left (never a regular file).
    name: the listener's, for the one line that says why it could not bind."""
    try:
        if stat.S_ISSOCK(os.stat(path).st_mode):
            os.unlink(path)
    except FileNotFoundError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
    except OSError as exc:  # its directory missing or not writable, a file in the way
        sock.close()
        raise CannotListen(
            f"listener {name!r}: cannot listen on unix socket {path}: {exc.strerror or exc}"
        ) from None
    os.chmod(path, 0o660)
    sock.listen(1024)
    sock.setblocking(False)
    return sock


def make_sites(
    runner: web.AppRunner,
    listeners: list[ListenerSettings],
    unix_socks: dict[str, socket.socket],
    reuse_port: bool,
) -> list[web.BaseSite]:
    sites: list[web.BaseSite] = []
    for lst in listeners:
        if lst.protocol != "http":
            continue  # gRPC listeners are the gRPC server's (gateway/grpc/server.py)
        if lst.unix is not None:
            sock = unix_socks.get(lst.unix) or bind_unix(lst.unix, lst.name)
            sites.append(web.SockSite(runner, sock))
        else:
            sites.append(
                web.TCPSite(
                    runner,
                    lst.host or "127.0.0.1",
                    lst.port or 0,
                    reuse_port=reuse_port or None,
                    backlog=1024,
                )
            )
    return sites
