"""Published policy versions, for episode-sticky versions and bounded policy lag.

The trainer publishes each new checkpoint's label with ``publish``; rollout workers read the list between
episodes. A worker whose pinned version is more than ``max_policy_lag`` versions behind the latest moves to the
latest before its next episode (never during one)."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

from trajlake.lake.storage import LakeStorage, is_uri


class PolicyVersions:
    """The ordered list of published versions of one policy, in ``<lake>/_trajlake/policies/<name>.json``.

    On object storage the list is one object rewritten by the trainer (one publisher) and read by the workers;
    there is no lock, so two concurrent publishers of the same policy could lose a label there."""

    def __init__(self, lake_root: str | Path, policy: str):
        self.remote = LakeStorage(lake_root) if is_uri(str(lake_root)) else None
        self._parts = ("_trajlake", "policies", f"{policy}.json")
        self.path = Path(lake_root).joinpath(*self._parts) if self.remote is None else Path(*self._parts)
        self.policy = policy

    def all(self) -> list[str]:
        try:
            if self.remote is not None:
                data = json.loads(self.remote.read_bytes(*self._parts))
            else:
                data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return []
        return [str(v) for v in data.get("versions", [])]

    def latest_label(self) -> str:
        versions = self.all()
        return versions[-1] if versions else f"{self.policy}-v0"

    def publish(self, label: str) -> None:
        if self.remote is not None:
            versions = self.all()
            if label not in versions:
                versions.append(label)
                self.remote.write_bytes(json.dumps({"policy": self.policy, "versions": versions}).encode(),
                                        *self._parts)
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "a+") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            versions = self.all()
            if label not in versions:
                versions.append(label)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"policy": self.policy, "versions": versions}))
            os.replace(tmp, self.path)

    def lag(self, label: str) -> int:
        """How many versions ``label`` is behind the latest (0 when current or nothing is published)."""
        versions = self.all()
        if not versions:
            return 0
        if label not in versions:
            return len(versions)
        return len(versions) - 1 - versions.index(label)
