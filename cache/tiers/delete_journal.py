"""Deletes Redis has not taken yet, kept in a file so that a process that stops during an outage
hands them on (cache.tiers.undeleted).

The keys of an invalidation whose delete Redis could not take live in the process's memory
until Redis answers. A sidecar stopped or killed before then (a deploy during a Redis outage)
took them with it: the old entry stayed in Redis, and every process served it until its TTL,
after the client had been told its change was made. Now each such key is also appended to a
file, one line a key, and the next process started on this host for the same Redis and key
prefix reads the file of any process that is gone and deletes those keys once Redis answers.
Admin purges waiting for Redis are kept the same way, a line with their SCAN pattern each
(cache.tiers.undeleted, cache.tiers.redis_purges).

- A file per live process, held with an exclusive flock (`--workers N`, two gateways on one
  host: each has its own). At start a process takes every file of its Redis and prefix that no
  live process holds: the first becomes its own, the keys of the others are appended to it and
  their files removed.
- Append-only while keys wait (rewritten with those alone past COMPACT_BYTES, during an outage
  too: written to a locked side file, then renamed over the journal), truncated once none is
  left. A line for a key that was deleted since, or stored again,
  is deleted again by the next process: a delete costs at most a miss.
- Written with write(2) and no fsync: a process that dies leaves its lines in the page cache; a
  host that loses power may lose the last of them.
- Named by a digest of the Redis URL and the key prefix (`undeleted-{digest}.{id}.log`), in
  `cache.redis.journal_dir`, else $LATENTGATE_STATE_DIR, else $XDG_STATE_HOME/latentgate, else
  ~/.local/state/latentgate. A directory that cannot be used is logged once and the keys stay in
  memory only, as before.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from cache.settings import RedisSettings

log = logging.getLogger("latentgate.cache.redis")

# Past this the file is rewritten with the keys still waiting (lines for keys that were deleted
# since only cost a miss, but need not grow without bound in a long outage).
COMPACT_BYTES = 8 << 20
# A rewrite's new content, before it is renamed over the journal (not matched by *.log)
SIDE_SUFFIX = ".new"


def default_dir(environ: os._Environ[str] | dict[str, str] = os.environ) -> Path:
    if environ.get("LATENTGATE_STATE_DIR"):
        return Path(environ["LATENTGATE_STATE_DIR"])
    base = environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local/state")
    return Path(base) / "latentgate"


def open_journal(settings: RedisSettings) -> DeleteJournal | None:
    """The journal `settings` ask for (None: off, or no usable directory)."""
    if not settings.journal or settings.url is None:
        return None
    where = Path(settings.journal_dir) if settings.journal_dir else default_dir()
    return DeleteJournal.open(where, settings.url, settings.key_prefix)


def digest(url: str, key_prefix: str) -> str:
    return hashlib.sha256(f"{url}\0{key_prefix}".encode()).hexdigest()[:16]


class DeleteJournal:
    """Open with `DeleteJournal.open`; `taken` holds the keys a gone process left waiting. The
    process's own file is made when it first has a key to keep (a process that never has one,
    or a test that builds a gateway and never runs it, holds no file)."""

    def __init__(self, directory: Path, stem: str) -> None:
        self.directory = directory
        self.stem = stem
        self.path: Path | None = None
        self.taken: dict[str, bool] = {}
        self._fh: IO[str] | None = None
        self._size = 0
        self._failing = False
        self._held: list[IO[str]] = []  # gone processes' files a failed merge kept

    @classmethod
    def open(cls, directory: Path, url: str, key_prefix: str) -> DeleteJournal | None:
        journal = cls(directory, f"undeleted-{digest(url, key_prefix)}.")
        try:
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            journal._claim()
        except OSError as exc:
            log.warning(
                "redis: no journal of waiting deletes in %s (%s): a process stopped during a Redis"
                " outage leaves its invalidations undone in Redis until their entries' TTL",
                directory,
                exc,
            )
            journal.close()
            return None
        return journal

    def _claim(self) -> None:
        """Take the files of this Redis and prefix that no live process holds: the first
        becomes this process's own, the others' keys go into it and their files are removed."""
        taken: dict[str, bool] = {}
        others: list[tuple[Path, IO[str]]] = []
        for side in self.directory.glob(self.stem + "*.log" + SIDE_SUFFIX):
            # a rewrite a kill stopped before its rename: the journal it was for is whole
            fh = _locked(side)
            if fh is not None:
                with contextlib.suppress(OSError):
                    side.unlink()
                fh.close()
        for path in sorted(self.directory.glob(self.stem + "*.log")):
            fh = _locked(path)
            if fh is None:
                continue  # a live process's
            fh.seek(0)
            for key, announce in _lines(fh):
                taken[key] = announce or taken.get(key, False)
            if self._fh is None:
                self.path, self._fh = path, fh
            else:
                others.append((path, fh))
        # the others' keys are in this file before theirs go
        merged = self._fh is None or self.rewrite(taken)
        for path, fh in others:
            if merged:
                with contextlib.suppress(OSError):
                    path.unlink()
                fh.close()
            else:
                # (a full disk) their keys are in no other file: kept, and held until this
                # process ends, for the next one to take
                self._held.append(fh)
        self.taken = taken
        if taken:
            log.info(
                "redis: %d deletes a stopped process left waiting (%s) will be sent once Redis"
                " answers",
                len(taken),
                self.directory,
            )

    def _own(self) -> IO[str]:
        if self._fh is None:
            path = self._own_path()
            fh = _locked(path)
            if fh is None:  # (a fresh random name: nobody else holds it)
                raise OSError(f"cannot lock {path}")
            self.path, self._fh, self._size = path, fh, 0
        return self._fh

    def append(self, key: str, announce: bool) -> None:
        line = f"{key}\t{int(announce)}\n"
        try:
            fh = self._own()
            fh.write(line)
            fh.flush()
            self._size += len(line)
            self._failing = False
        except OSError as exc:
            self._failed(exc)

    def _failed(self, exc: OSError) -> None:
        # once per spell, not once per failed delete (a directory that turned read-only)
        if not self._failing:
            self._failing = True
            log.warning("redis: the journal of waiting deletes could not be written: %s", exc)

    def rewrite(self, keys: dict[str, bool]) -> bool:
        """The file holds `keys` alone (none: it is emptied); False: it could not be written
        (logged) and holds what it held. The new content is written to a locked side file and
        renamed over the old one: truncating and writing in place lost every waiting key to a
        kill (or a full disk) between the two."""
        if self._fh is None and not keys:
            return True
        if not keys:
            try:
                fh = self._own()
                fh.seek(0)
                fh.truncate()  # one syscall: nothing is left to lose
                self._size = 0
                self._failing = False
            except OSError as exc:
                self._failed(exc)
                return False
            return True
        side: Path | None = None
        try:
            path = self._own_path()
            side = path.with_name(path.name + SIDE_SUFFIX)
            fh = open(side, "w+", encoding="utf-8", errors="replace")  # noqa: SIM115 (kept)
            try:
                # locked before it has the journal's name: no claim can take it half-written
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                fh.writelines(f"{k}\t{int(a)}\n" for k, a in keys.items())
                fh.flush()
                os.replace(side, path)
            except BaseException:
                fh.close()
                raise
            side = None
            if self._fh is not None:
                self._fh.close()  # the old inode, unlinked by the rename
            self._fh, self._size = fh, fh.tell()
            self._failing = False
            return True
        except OSError as exc:
            self._failed(exc)
            return False
        finally:
            if side is not None:
                with contextlib.suppress(OSError):
                    side.unlink()

    def _own_path(self) -> Path:
        if self.path is None:
            self.path = self.directory / f"{self.stem}{uuid.uuid4().hex[:12]}.log"
        return self.path

    @property
    def oversized(self) -> bool:
        return self._size > COMPACT_BYTES

    @property
    def empty(self) -> bool:
        return self._size == 0

    def close(self) -> None:
        """Closing lets the lock go; the file stays for the next process if keys wait in it."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        for fh in self._held:
            fh.close()
        self._held.clear()


def _locked(path: Path) -> IO[str] | None:
    # errors="replace": bytes that are not UTF-8 (a block a power loss or a disk error left)
    # cost their line (_lines), not the start: a UnicodeDecodeError from here failed the
    # gateway's start, at every restart, until the file was removed by hand
    fh = open(path, "a+", encoding="utf-8", errors="replace")  # noqa: SIM115 (held for life)
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        # Still the file at this path: another process may have taken it (its keys, then the
        # file removed) between our open and our lock. Locked after, it would be kept as a
        # journal no other process can ever find.
        if os.fstat(fh.fileno()).st_ino != path.stat().st_ino:
            raise BlockingIOError
    except (BlockingIOError, FileNotFoundError):
        fh.close()
        return None
    return fh


def _lines(fh: IO[str]) -> Iterator[tuple[str, bool]]:
    for line in fh:
        key, sep, announce = line.rstrip("\n").partition("\t")
        # (a line cut short by a crash is dropped, and so is one with bytes that were not
        # UTF-8: keys are ASCII, so that line's key is not one this cache wrote whole)
        if key and sep and "\ufffd" not in key:
            yield key, announce == "1"
