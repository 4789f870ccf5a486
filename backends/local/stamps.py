"""An artifact's stamp (`<file>.stamp` beside it): its length and what it was built from.

Checked before an artifact is loaded, so a file cut short (a copy onto a full disk, a crash
before its blocks reached the disk) or built from other weights (an ONNX file replaced after
its INT8 build) is rebuilt or refused instead of served. Only a length is compared, not a
digest: hashing each 90 MB file would cost every start about half a second.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".stamp")


def write_stamp(path: Path, size: int, source: str) -> None:
    """Written (atomically) before the artifact is renamed into place: a stamp without its
    file only means the file is missing, and a file is never in place without its stamp."""
    stamp = stamp_path(path)
    tmp = stamp.with_name(f"{stamp.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps({"bytes": size, "source": source}))
    os.replace(tmp, stamp)


def stamp_problem(path: Path, source: str | None = None) -> str | None:
    """Why `path` is not the file its stamp describes, or None. A file without a stamp (put
    there by hand, or built by a version before stamps) is trusted as it always was."""
    try:
        raw = stamp_path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        stamp = json.loads(raw)
        size, built_from = int(stamp["bytes"]), str(stamp["source"])
    except (ValueError, KeyError, TypeError):
        return f"has an unreadable stamp ({stamp_path(path).name})"
    actual = path.stat().st_size
    if actual != size:
        return f"is {actual} bytes where its build wrote {size} (cut short or overwritten)"
    if source is not None and built_from != source:
        return f"was built from another model (hash {built_from[:16]}, now {source[:16]})"
    return None
