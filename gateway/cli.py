"""Command line: `latentgate serve` and `latentgate check-config`. Parses flags, then calls in."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from backends import preflight
from cache import semantic_preflight
from gateway.config import ConfigError, ListenerSettings, Settings, load_settings
from gateway.early_signals import remember_early
from gateway.redact import install_redaction
from gateway.version import version

DEFAULT_CONFIG = "config/latentgate.yaml"


def _apply_flags(settings: Settings, args: argparse.Namespace) -> Settings:
    listeners = list(settings.listeners)
    if args.host is not None or args.port is not None:
        tcp = [lst for lst in listeners if lst.unix is None and lst.protocol == "http"]
        base = tcp[0] if tcp else ListenerSettings(host="127.0.0.1", port=8080)
        new = base.model_copy(
            update={
                "host": args.host if args.host is not None else base.host,
                "port": args.port if args.port is not None else base.port,
            }
        )
        listeners = [new] + [lst for lst in listeners if lst not in tcp]
    if args.uds:
        listeners.append(ListenerSettings(name="uds", unix=args.uds))
    update: dict[str, object] = {"listeners": listeners}
    if args.log_level:
        update["logging"] = settings.logging.model_copy(update={"level": args.log_level})
    return settings.model_copy(update=update)


def _port(text: str) -> int:
    # the flag is applied past the config's validation: 70000 bound port 4464 (aiohttp wraps it)
    # and -1 ended in a traceback
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port (0-65535; 0: any free one)")
    return port


def _workers(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of workers") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n}: at least 1 worker")
    return n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="latentgate", description="Caching inference gateway")
    parser.add_argument("--version", action="version", version=f"latentgate {version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="start the gateway")
    serve.add_argument("--config", default=os.environ.get("LATENTGATE_CONFIG", DEFAULT_CONFIG))
    serve.add_argument("--host")
    serve.add_argument("--port", type=_port)
    serve.add_argument("--uds", help="also listen on this unix socket path")
    serve.add_argument("--workers", type=_workers, default=1)
    serve.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    check = sub.add_parser("check-config", help="validate a config file and print every error")
    check.add_argument("path")
    build = sub.add_parser("build", help="export/build a local model and report its accuracy")
    build.add_argument("model", help="builtin:NAME or an ONNX file")
    build.add_argument("--precision", choices=["fp32", "fp16", "int8"], default="fp32")
    build.add_argument("--calibration", help="INT8 calibration texts, one per line")
    build.add_argument("--validation", help="validation texts (default: the STS-B dev sentences)")
    build.add_argument("--min-cosine", type=float, default=0.999, help="promotion bound")
    build.add_argument("--min-agreement", type=float, default=0.99,
                       help="classifiers' promotion bound (top-1 agreement)")  # fmt: skip
    build.add_argument("--task", choices=["auto", "embedder", "classifier"], default="auto",
                       help="auto: a 2-D (batch, classes) output is a classifier")  # fmt: skip
    build.add_argument("--tokenizer", help="tokenizer.json for an ONNX file (builtins have one)")
    build.add_argument("--artifacts", default=os.environ.get("LATENTGATE_ARTIFACTS"))
    prof = sub.add_parser("profile", help="send traffic and print p50/p99 per Server-Timing stage")
    prof.add_argument("url")
    prof.add_argument("--requests", type=int, default=200)
    prof.add_argument("--concurrency", type=int, default=8)
    prof.add_argument("--body", help="file whose bytes are each request's body (POST by default)")
    prof.add_argument("--method")
    prof.add_argument("--header", action="append", default=[], help="'Name: value', repeatable")
    prof.add_argument("--plot", help="also write a chart to this PNG file (needs matplotlib)")
    args = parser.parse_args(argv)

    if args.command == "build":
        from backends.local import run_build

        return run_build(
            args.model,
            args.precision,
            calibration=args.calibration,
            validation=args.validation,
            min_cosine=args.min_cosine,
            min_agreement=args.min_agreement,
            tokenizer=args.tokenizer,
            task=args.task,
            artifacts_dir=args.artifacts,
        )

    if args.command == "profile":
        from gateway.profile import main as profile_main

        return profile_main(args)

    if args.command == "check-config":
        try:
            checked = load_settings(args.path)
        except ConfigError as err:
            print(f"{err.source}: {len(err.issues)} error(s)", file=sys.stderr)
            for issue in err.issues:
                print(f"  {issue}", file=sys.stderr)
            return 1
        if problems := preflight(checked.backends) + semantic_preflight(
            checked.cache, checked.routes
        ):
            print(f"{args.path}: {len(problems)} problem(s): cannot start here", file=sys.stderr)
            for problem in problems:
                print(f"  {problem}", file=sys.stderr)
            return 1
        print(f"{args.path}: ok")
        return 0

    early = remember_early()  # a reload asked for while this starts is not its end
    try:
        settings = _apply_flags(load_settings(args.config), args)
    except ConfigError as err:
        for issue in err.issues:
            print(f"{err.source}: {issue}", file=sys.stderr)
        return 2
    if problems := preflight(settings.backends) + semantic_preflight(
        settings.cache, settings.routes
    ):
        for problem in problems:
            print(f"{args.config}: refusing to start: {problem}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=settings.logging.level.upper(),
        format="%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s",
    )
    from gateway.server import run

    install_redaction(settings)
    return run(settings, workers=args.workers, config_path=args.config, early=early)
