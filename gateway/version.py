"""The installed latentgate version (`latentgate --version`, GET /v2), from package metadata."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _dist_version


def version() -> str:
    try:
        return _dist_version("latentgate")
    except PackageNotFoundError:  # a source tree that was never installed
        return "0+unknown"
