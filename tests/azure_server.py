"""A real Azure Blob Storage API on loopback for the object-storage tests: Azurite (npm's ``azurite``, the emulator
Microsoft ships) in a child process on a free port with a temporary folder, using the well-known emulator account
and key, so a wrong key is refused as Azure would.

Azurite is a Node program, not a Python package: ``.ci/run`` installs it with
``npm install --prefix .tools/azurite azurite@3.37.0``. The tests look for ``$TRAJLAKE_AZURITE`` (an
``azurite-blob`` executable), then ``.tools/azurite``, then ``azurite-blob`` on PATH, and skip saying so when none
is there. 3.37 or later: older releases ignore the ``startFrom`` listing parameter object_store sends, which
breaks every second commit to a table."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import os
import shutil
import subprocess
import tempfile
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.servers import free_port, port_answers, wait_until_up
from trajlake.lake.storage import EMULATOR_ACCOUNT, EMULATOR_KEY

REPO = Path(__file__).resolve().parents[1]
MIN_VERSION = (3, 37)
INSTALL = "npm install --prefix .tools/azurite azurite@3.37.0"


@dataclass(frozen=True)
class AzuriteServer:
    url: str  # http://127.0.0.1:<port>; the account's blobs are under <url>/devstoreaccount1

    def env(self) -> dict[str, str]:
        """The variables a trajlake process needs to reach this emulator (object_store's own names)."""
        return {"AZURE_STORAGE_USE_EMULATOR": "true", "AZURITE_BLOB_STORAGE_URL": self.url}

    @staticmethod
    def account_sas(key: str = EMULATOR_KEY, version: str = "2021-08-06") -> str:
        """An account SAS token (blob service; read, write, delete, list, add, create) signed with ``key``, as
        the portal's "Shared access signature" page makes them (without the leading ``?``)."""
        fields = {"sv": version, "ss": "b", "srt": "sco", "sp": "rwdlac", "se": "2099-01-01T00:00:00Z",
                  "spr": "https,http"}
        to_sign = "\n".join([EMULATOR_ACCOUNT, fields["sp"], fields["ss"], fields["srt"], "", fields["se"], "",
                             fields["spr"], version, "", ""])
        sig = base64.b64encode(hmac.new(base64.b64decode(key), to_sign.encode(), hashlib.sha256).digest()).decode()
        return urllib.parse.urlencode({**fields, "sig": sig})

    def create_container(self, name: str) -> None:
        import pyarrow.fs as pafs

        authority = self.url.split("://", 1)[1]
        fs = pafs.AzureFileSystem(EMULATOR_ACCOUNT, account_key=EMULATOR_KEY, blob_storage_authority=authority,
                                  dfs_storage_authority=authority, blob_storage_scheme="http",
                                  dfs_storage_scheme="http")
        fs.create_dir(name)


def azurite_executable() -> str | None:
    """The azurite-blob to run, or None when Azurite is not installed."""
    candidates = [os.environ.get("TRAJLAKE_AZURITE"), str(REPO / ".tools/azurite/node_modules/.bin/azurite-blob"),
                  shutil.which("azurite-blob")]
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


def _version(exe: str) -> tuple[int, ...]:
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60).stdout.strip()
    return tuple(int(p) for p in out.split(".") if p.isdigit())


@contextlib.contextmanager
def start_azurite(exe: str) -> Iterator[AzuriteServer]:
    """Azurite's blob service on a free loopback port, storing into a temporary folder; stopped on exit."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="trajlake-azurite-") as folder:
        # --skipApiVersionCheck: the clients may speak a newer API version than the emulator knows;
        # --loose: ignore headers Azurite does not implement instead of refusing the request
        proc = subprocess.Popen([exe, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", folder,
                                 "--skipApiVersionCheck", "--loose", "--disableTelemetry", "--silent"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_until_up(proc, port_answers(port), "Azurite")
            yield AzuriteServer(f"http://127.0.0.1:{port}")
        finally:
            proc.terminate()
            proc.wait(timeout=10)


@pytest.fixture(scope="session")
def azurite() -> Iterator[AzuriteServer]:
    exe = azurite_executable()
    if exe is None:
        pytest.skip(f"the Azure tests need Azurite (npm): {INSTALL}, or set TRAJLAKE_AZURITE to azurite-blob")
    version = _version(exe)
    if version < MIN_VERSION:
        pytest.skip(f"Azurite {'.'.join(map(str, version))} at {exe} is older than 3.37 (it ignores the "
                    f"startFrom listing object_store uses): {INSTALL}")
    with start_azurite(exe) as server:
        yield server


_CONTAINERS = iter(range(10**6))


@pytest.fixture
def az_lake_uri(azurite: AzuriteServer, monkeypatch: pytest.MonkeyPatch) -> str:
    """A new empty container, the emulator's variables set, and the URI of a lake in it."""
    container = f"lake-{os.getpid()}-{next(_CONTAINERS)}"
    azurite.create_container(container)
    for name in [n for n in os.environ if n.startswith("AZURE_STORAGE_")]:
        monkeypatch.delenv(name)
    for k, v in azurite.env().items():
        monkeypatch.setenv(k, v)
    return f"az://{container}/trajlake/lake"
