"""latentgate's HTTP edge: listeners, routing, protocol adapters, config, admin, metrics, CLI."""

from gateway.app import build_app
from gateway.config import Settings, load_settings, parse_settings

__all__ = ["Settings", "build_app", "load_settings", "parse_settings"]
