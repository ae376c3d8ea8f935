"""Published policy versions, for episode-sticky versions and bounded policy lag.

The trainer publishes each new checkpoint's label with ``publish``; rollout workers read the list between
episodes. A worker whose pinned version is more than ``max_policy_lag`` versions behind the latest moves to the
latest before its next episode (never during one). A version published with its checkpoint folder
(``publish(label, checkpoint=...)``) can also be loaded between two turns of an episode
(``RolloutConfig.turn_upgrades``)."""

from __future__ import annotations

import fcntl
import json
import os
import re
from pathlib import Path
from urllib.parse import quote, unquote

from trajlake.lake.storage import LakeStorage, is_uri

# One object per published label on object storage: ``<seq>-<quoted label>.json``.
_ENTRY = re.compile(r"^(\d{12})-(.+)\.json$")


class PolicyVersions:
    """The ordered list of published versions of one policy.

    A local lake keeps it in ``<lake>/_trajlake/policies/<name>.json``, rewritten under a file lock. Object storage
    has no lock and pyarrow no conditional put, so there each ``publish`` writes one new object,
    ``_trajlake/policies/<name>/<seq>-<label>.json``, and never rewrites one: concurrent publishers cannot lose a
    label. The list is one LIST of that folder, ordered by (seq, label), the labels read from the names; a
    publish takes seq = the highest listed + 1, so two publishers racing for a seq both keep their label and
    are ordered by label. The single object of lakes published before (``<name>.json``) is read first."""

    def __init__(self, lake_root: str | Path, policy: str):
        self.remote = LakeStorage(lake_root) if is_uri(str(lake_root)) else None
        self._parts = ("_trajlake", "policies", f"{policy}.json")
        self._folder = ("_trajlake", "policies", policy)
        self.path = Path(lake_root).joinpath(*self._parts) if self.remote is None else Path(*self._parts)
        self.policy = policy

    def all(self) -> list[str]:
        if self.remote is not None:
            return [label for _, label in self._remote_entries()]
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return []
        return [str(v) for v in data.get("versions", [])]

    def _remote_entries(self) -> list[tuple[int, str]]:
        """(seq, label) in publish order, each label once (its first publication): the old single object's
        list (seq 0) then the per-label objects."""
        assert self.remote is not None
        entries: list[tuple[int, str]] = []
        try:
            old = json.loads(self.remote.read_bytes(*self._parts))
            entries += [(0, str(v)) for v in old.get("versions", [])]
        except FileNotFoundError:
            pass
        found = []
        for name in self.remote.listdir(*self._folder):
            m = _ENTRY.match(name)
            if m:
                found.append((int(m.group(1)), unquote(m.group(2))))
        entries += sorted(found)
        seen: set[str] = set()
        out = []
        for seq, label in entries:
            if label not in seen:
                seen.add(label)
                out.append((seq, label))
        return out

    def latest_label(self) -> str:
        versions = self.all()
        return versions[-1] if versions else f"{self.policy}-v0"

    def checkpoint(self, label: str) -> str | None:
        """The checkpoint folder ``label`` was published with (None: published without one, or not published)."""
        if self.remote is not None:
            for seq, v in self._remote_entries():
                if v == label and seq > 0:
                    data = json.loads(self.remote.read_bytes(*self._folder, f"{seq:012d}-{quote(label, safe='')}.json"))
                    return data.get("checkpoint")
            return None
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        return data.get("checkpoints", {}).get(label)

    def publish(self, label: str, checkpoint: str | None = None) -> None:
        """Append ``label`` (a no-op when it is already published); ``checkpoint``: the folder holding its weights,
        recorded so a rollout worker can load it at a turn boundary."""
        if self.remote is not None:
            entries = self._remote_entries()
            if any(v == label for _, v in entries):
                return
            seq = max((s for s, _ in entries), default=0) + 1
            entry = {"policy": self.policy, "label": label, **({"checkpoint": checkpoint} if checkpoint else {})}
            # safe="" quotes "/" too: one object name per label, whatever the label holds
            self.remote.write_bytes(json.dumps(entry).encode(), *self._folder,
                                    f"{seq:012d}-{quote(label, safe='')}.json")
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "a+") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                data = json.loads(self.path.read_text())
            except FileNotFoundError:
                data = {}
            versions = [str(v) for v in data.get("versions", [])]
            checkpoints = dict(data.get("checkpoints", {}))
            if label not in versions:
                versions.append(label)
                if checkpoint:
                    checkpoints[label] = checkpoint
            doc: dict[str, object] = {"policy": self.policy, "versions": versions}
            if checkpoints:
                doc["checkpoints"] = checkpoints
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(doc))
            os.replace(tmp, self.path)

    def lag(self, label: str) -> int:
        """How many versions ``label`` is behind the latest (0 when current or nothing is published)."""
        versions = self.all()
        if not versions:
            return 0
        if label not in versions:
            return len(versions)
        return len(versions) - 1 - versions.index(label)
