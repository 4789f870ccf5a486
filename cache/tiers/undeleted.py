"""Keys whose delete did not reach Redis, remembered until it does.

An unsafe request's invalidation (RFC 9111 4.4), a store that raced a purge, an undecodable
entry: each deletes one key in Redis. With Redis slow, or the breaker open (a busy process's
stalled reads open it while Redis itself is fine), that delete used to be dropped: the old
entry stayed in Redis for every other process to read, and for this one to read back once its
memory had let go, and the other processes' memory tiers were never told. Now such a key is
remembered: this process reads none of them from Redis (a miss: the upstream answers), a store
under one overwrites the old entry (forgotten), and the tier deletes the rest once Redis takes
commands again and then has the other processes told (RedisTier._retry_deletes). A key another
process announced with its delete unconfirmed is remembered the same way, but not announced
again once deleted here: that process, and every other, was told already.

Bounded: past `cap` keys the oldest is forgotten (counted and logged; that entry then lives
until its TTL, as every such entry did before).

With a journal (cache.tiers.delete_journal), a key whose delete failed is also written to a file
(`keep`), so a process that stops before Redis answers hands it to the next one; the keys a
stopped process left start here. So are purges waiting for Redis (cache.tiers.redis_purges),
one line each with their SCAN pattern (`keep_purge`; a `*` is in no key, and a release that
reads it as a key deletes a key that does not exist), until they land (`purge_done`).
"""

from __future__ import annotations

from collections import OrderedDict

from cache.tiers.delete_journal import DeleteJournal

MAX_UNDELETED = 16384  # ~2 MB of key strings at most
PURGE_MARK = "*"  # in a purge's pattern (cache.keys.Selector.pattern), never in a key


class UndeletedKeys:
    def __init__(self, cap: int = MAX_UNDELETED, journal: DeleteJournal | None = None) -> None:
        self.cap = cap
        self._keys: OrderedDict[str, bool] = OrderedDict()  # key: announce once deleted
        self.journal = journal
        # waiting purges' patterns, journaled beside the keys: announce once landed
        self.purges: dict[str, bool] = {}
        # the file holds lines for keys: emptied (but for the purges) once none waits
        self._stale = journal is not None and not journal.empty
        if journal is not None:
            for key, announce in journal.taken.items():
                if PURGE_MARK in key:
                    self.purges[key] = announce
                else:
                    self.add(key, announce)

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: str) -> bool:
        return key in self._keys

    def add(self, key: str, announce: bool = True) -> bool:
        """Remember `key`; True when the oldest key was forgotten to make room. `announce`:
        have the other processes told once it is deleted (kept if any add asked for it)."""
        self._keys[key] = announce or self._keys.get(key, False)
        self._keys.move_to_end(key)
        if len(self._keys) > self.cap:
            self._keys.popitem(last=False)
            return True
        return False

    def keep(self, key: str) -> None:
        """`key` (added) waits for Redis: written to the journal, for the next process if this
        one stops first."""
        if self.journal is not None and key in self._keys:
            self.journal.append(key, self._keys[key])
            self._stale = True
            if self.journal.oversized:
                # compacted here too: settle runs only once deletes land, and through an outage
                # the file grew by a line per failed delete without bound (the keys that wait,
                # at most `cap` of them, are well under the bound, so this cannot repeat at once)
                self._rewrite(self.journal)

    def keep_purge(self, pattern: str, announce: bool) -> None:
        """A purge (its SCAN pattern) waits for Redis: journaled until `purge_done`."""
        if self.journal is not None and self.purges.get(pattern) != announce:
            self.purges[pattern] = announce
            self.journal.append(pattern, announce)

    def purge_done(self, pattern: str) -> None:
        """The purge landed (or was forgotten): its line goes at once, since a next process that
        ran it again would drop what every process stored since."""
        if self.journal is not None and self.purges.pop(pattern, None) is not None:
            self._rewrite(self.journal)

    def _rewrite(self, journal: DeleteJournal) -> None:
        ok = journal.rewrite({**self._keys, **self.purges})
        self._stale = bool(self._keys) or not ok

    def discard(self, key: str) -> None:
        self._keys.pop(key, None)

    def settle(self) -> None:
        """After deletes landed: the journal is emptied once no key waits, and compacted when
        lines for keys deleted since have piled up."""
        j = self.journal
        if j is not None and ((not self._keys and self._stale) or j.oversized):
            self._rewrite(j)

    def close(self) -> None:
        if self.journal is not None:
            self.journal.close()

    def to_announce(self, keys: list[str]) -> list[str]:
        return [k for k in keys if self._keys.get(k, False)]

    def oldest(self, n: int) -> list[str]:
        out: list[str] = []
        for key in self._keys:
            if len(out) == n:
                break
            out.append(key)
        return out
