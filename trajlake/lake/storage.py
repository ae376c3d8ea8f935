"""Where a lake lives: a local folder or an object-store prefix (``s3://bucket/prefix``, ``az://container/prefix``).

One object gives every layer what it needs for either: the Delta table URIs and delta-rs ``storage_options`` (the
commits), a ``pyarrow.fs`` filesystem and paths in it (the data files trajlake writes and reads itself), and
small-object helpers for ``_trajlake/`` (lake.json, commit records, policy versions). A local lake keeps the code
paths it always had: plain paths, ``filesystem=None``, ``os.replace``, fsync.

Credentials and the endpoint come from each store's standard variables. S3: ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION`` (or ``AWS_DEFAULT_REGION``), ``AWS_ENDPOINT_URL``
(an S3-compatible server) and ``AWS_ALLOW_HTTP`` (a plain-http endpoint). Azure Blob Storage: the names delta-rs's
object_store reads, ``AZURE_STORAGE_ACCOUNT_NAME``, ``AZURE_STORAGE_ACCOUNT_KEY``, ``AZURE_STORAGE_SAS_TOKEN``,
``AZURE_STORAGE_ENDPOINT``, ``AZURE_STORAGE_USE_EMULATOR`` (+ ``AZURITE_BLOB_STORAGE_URL``), and the Azure SDKs'
``AZURE_STORAGE_CONNECTION_STRING``. See docs/scale.md, "Object storage".
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, urlsplit

import pyarrow.fs as pafs

from trajlake.errors import TrajlakeError, one_line

S3_SCHEMES = ("s3",)
# az:// is fsspec's and object_store's name; abfs[s]:// the Hadoop driver's (container@account.dfs.core.windows.net
# or fsspec's container/path); azure:// object_store's own. Table URIs are always written az:// (see AzureSettings).
AZURE_SCHEMES = ("az", "abfs", "abfss", "azure")
SUPPORTED = "a lake is a local folder, s3://bucket/prefix or az://container/prefix"
AWS_HELP = ("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for temporary keys), "
            "AWS_REGION, and AWS_ENDPOINT_URL (+ AWS_ALLOW_HTTP=true for http) for an S3-compatible server")
AZURE_HELP = ("set AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY or AZURE_STORAGE_SAS_TOKEN (or "
              "AZURE_STORAGE_CONNECTION_STRING), AZURE_STORAGE_ENDPOINT for a custom endpoint, or "
              "AZURE_STORAGE_USE_EMULATOR=true and AZURITE_BLOB_STORAGE_URL for Azurite")
# Azurite's (and the old storage emulator's) well-known account and key: public, documented by Microsoft.
EMULATOR_ACCOUNT = "devstoreaccount1"
EMULATOR_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
# delta-rs can reach a custom GCS endpoint, but lists through GCS's XML API, which no emulator installable offline
# implements (docs/scale.md): gs:// is refused rather than shipped untested.
GCS_REFUSED = "Google Cloud Storage lakes are not supported yet: no offline emulator runs delta-rs's commits"
EMULATOR_URL = "http://127.0.0.1:10000"  # object_store's default when AZURITE_BLOB_STORAGE_URL is unset


def is_uri(location: str | os.PathLike[str]) -> bool:
    """Whether ``location`` names an object store (``scheme://...``) rather than a local path."""
    return isinstance(location, str) and "://" in location


def _env(env: Mapping[str, str], *names: str) -> str | None:
    for n in names:
        if env.get(n):
            return env[n]
    return None


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def _parse_connection_string(text: str) -> dict[str, str]:
    """``Key=Value;...`` of an Azure connection string, keys lower-cased (a value may itself hold ``=``)."""
    out: dict[str, str] = {}
    for part in text.split(";"):
        key, sep, value = part.strip().partition("=")
        if sep and key:
            out[key.strip().lower()] = value.strip()
    return out


@dataclass(frozen=True)
class AzureSettings:
    """One Azure Blob Storage account as every layer needs it: delta-rs storage_options, a pyarrow
    AzureFileSystem, and a connection string for DuckDB's azure and delta extensions."""

    account: str
    key: str | None = None
    sas_token: str | None = None
    endpoint: str | None = None  # the account's blob URL; None: https://<account>.blob.core.windows.net
    emulator: bool = False

    @classmethod
    def from_env(cls, uri: str, account_in_uri: str | None, env: Mapping[str, str]) -> AzureSettings:
        cs = _parse_connection_string(_env(env, "AZURE_STORAGE_CONNECTION_STRING") or "")
        emulator = _truthy(_env(env, "AZURE_STORAGE_USE_EMULATOR")) or _truthy(cs.get("usedevelopmentstorage"))
        # explicit variables win over the connection string's fields
        account = (account_in_uri or _env(env, "AZURE_STORAGE_ACCOUNT_NAME") or cs.get("accountname")
                   or (EMULATOR_ACCOUNT if emulator else None))
        if not account:
            raise TrajlakeError(f"{uri}: no Azure storage account given ({AZURE_HELP})")
        key = _env(env, "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_ACCESS_KEY") or cs.get("accountkey")
        sas = _env(env, "AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_SAS_KEY") or cs.get("sharedaccesssignature")
        if emulator and not key and not sas:
            key = EMULATOR_KEY
        if key:
            try:
                base64.b64decode(key, validate=True)
            except binascii.Error:
                raise TrajlakeError(f"{uri}: the Azure account key is not base64 (copy it whole from the portal's "
                                    f"Access keys; {AZURE_HELP})") from None
        endpoint = _env(env, "AZURE_STORAGE_ENDPOINT") or cs.get("blobendpoint")
        if not endpoint and emulator:
            endpoint = (_env(env, "AZURITE_BLOB_STORAGE_URL") or EMULATOR_URL).rstrip("/") + "/" + account
        if not endpoint and cs.get("endpointsuffix", "core.windows.net") != "core.windows.net":
            endpoint = f"{cs.get('defaultendpointsprotocol', 'https')}://{account}.blob.{cs['endpointsuffix']}"
        if endpoint:
            endpoint = endpoint.rstrip("/")
            if urlsplit(endpoint).scheme == "http" and not emulator and not _truthy(_env(env, "AZURE_ALLOW_HTTP")):
                raise TrajlakeError(f"{uri}: the Azure endpoint {endpoint} is plain http; set AZURE_ALLOW_HTTP=true "
                                    f"to allow it")
        return cls(account, key, (sas or "").lstrip("?") or None, endpoint, emulator)

    @property
    def account_url(self) -> str:
        return self.endpoint or f"https://{self.account}.blob.core.windows.net"

    def storage_options(self) -> dict[str, str]:
        """delta-rs (object_store) options. The endpoint is always explicit and use_emulator false: with
        use_emulator object_store would ignore the endpoint for AZURITE_BLOB_STORAGE_URL of the process."""
        opts = {"azure_storage_account_name": self.account, "azure_storage_use_emulator": "false"}
        if self.key:
            opts["azure_storage_account_key"] = self.key
        elif self.sas_token:
            opts["azure_storage_sas_key"] = self.sas_token
        if self.endpoint:
            opts["azure_storage_endpoint"] = self.endpoint
            if urlsplit(self.endpoint).scheme == "http":
                opts["azure_allow_http"] = "true"
        return opts

    def filesystem(self, uri: str) -> pafs.FileSystem:
        """A pyarrow AzureFileSystem (its root is the account: paths are ``container/path``)."""
        args: dict[str, Any] = {"account_name": self.account}
        if self.key:
            args["account_key"] = self.key
        elif self.sas_token:
            args["sas_token"] = "?" + self.sas_token  # pyarrow appends it to URLs as given: with its "?"
        if self.endpoint:
            ep = urlsplit(self.endpoint)
            if ep.path.strip("/") == self.account:  # path style: http://host:port/<account> (Azurite)
                blob = dfs = ep.netloc
            elif ep.netloc.startswith(self.account + "."):  # host style: https://<account>.blob.<suffix>
                blob = ep.netloc[len(self.account):]
                dfs = blob.replace(".blob.", ".dfs.", 1)
            else:
                raise TrajlakeError(f"{uri}: the Azure endpoint {self.endpoint} is neither "
                                    f"https://{self.account}.<host> nor http(s)://<host>/{self.account}")
            args.update(blob_storage_authority=blob, dfs_storage_authority=dfs, blob_storage_scheme=ep.scheme,
                        dfs_storage_scheme=ep.scheme)
        try:
            return pafs.AzureFileSystem(**args)
        except (OSError, ValueError, TypeError) as e:  # TypeError: a pyarrow too old for sas_token
            raise TrajlakeError(f"{uri}: unusable Azure credentials ({one_line(e)[:160]}); {AZURE_HELP}") from e

    def connection_string(self) -> str | None:
        """For DuckDB's azure secret (the delta extension reads its AccountName/AccountKey, or BlobEndpoint and
        SharedAccessSignature); None without a key or SAS token (then DuckDB's credential chain)."""
        if not self.key and not self.sas_token:
            return None
        parts = [f"DefaultEndpointsProtocol={urlsplit(self.account_url).scheme}", f"AccountName={self.account}"]
        parts.append(f"AccountKey={self.key}" if self.key else f"SharedAccessSignature={self.sas_token}")
        parts.append(f"BlobEndpoint={self.account_url}")
        return ";".join(parts)


class LakeStorage:
    """The storage of one lake root (see the module docstring)."""

    def __init__(self, location: str | os.PathLike[str], env: Mapping[str, str] | None = None):
        env = os.environ if env is None else env
        self.local = not is_uri(location)
        self.azure: AzureSettings | None = None
        self.endpoint: str | None = None
        self.region: str | None = None
        self._store_handler: tuple[int, Any] | None = None  # (pid, object_store handler): see _object_store
        if self.local:
            self.kind = "local"
            self.root_path: Path | None = Path(location).absolute()
            self.uri = str(self.root_path)
            self.table_base = self.uri
            self.fs: pafs.FileSystem | None = None  # local files keep their plain-path code paths
            self.base = self.uri
            self.storage_options: dict[str, str] | None = None
            return
        self.root_path = None
        text = str(location).rstrip("/")
        parts = urlsplit(text)
        self.uri = text
        if parts.scheme in S3_SCHEMES:
            self._init_s3(text, parts, env)
        elif parts.scheme in AZURE_SCHEMES:
            self._init_azure(text, parts, env)
        else:
            raise TrajlakeError(f"{text}: unsupported lake URI scheme {parts.scheme!r}; {SUPPORTED}"
                                + (f" ({GCS_REFUSED})" if parts.scheme in ("gs", "gcs") else ""))

    def _init_azure(self, text: str, parts: SplitResult, env: Mapping[str, str]) -> None:
        self.kind = "azure"
        # abfs[s]://container@account.dfs.core.windows.net/path names the account; az://container/path does not
        container, _, host = parts.netloc.rpartition("@") if "@" in parts.netloc else (parts.netloc, "", "")
        if not container:
            raise TrajlakeError(f"{text}: no container; a lake on Azure is az://container/prefix")
        account = host.split(".", 1)[0] if host else None
        self.azure = AzureSettings.from_env(text, account, env)
        self.endpoint = self.azure.account_url
        self.base = container + parts.path  # container/prefix, the path inside the account's filesystem
        # one spelling for delta-rs and DuckDB (whose delta extension misparses abfs:// and whose azure extension
        # reads abfss:// through the Data Lake API, which Azurite lacks)
        self.table_base = f"az://{container}{parts.path}"
        self.storage_options = self.azure.storage_options()
        self.fs = self.azure.filesystem(text)

    def _init_s3(self, text: str, parts: SplitResult, env: Mapping[str, str]) -> None:
        self.kind = "s3"
        if not parts.netloc:
            raise TrajlakeError(f"{text}: no bucket; a lake on object storage is s3://bucket/prefix")
        self.base = parts.netloc + parts.path  # bucket/prefix, the path inside the S3 filesystem
        self.table_base = text
        key = _env(env, "AWS_ACCESS_KEY_ID")
        secret = _env(env, "AWS_SECRET_ACCESS_KEY")
        token = _env(env, "AWS_SESSION_TOKEN")
        region = _env(env, "AWS_REGION", "AWS_DEFAULT_REGION")
        endpoint = _env(env, "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
        allow_http = _truthy(_env(env, "AWS_ALLOW_HTTP"))
        self.endpoint = endpoint
        self.region = region
        opts: dict[str, str] = {
            # Concurrent writers: a commit creates its log entry with a conditional put (If-None-Match: *), which
            # AWS S3 (since 2024-08), MinIO, R2 and moto honour; no DynamoDB lock and no unsafe rename.
            "conditional_put": "etag",
        }
        for name, value in (("AWS_ACCESS_KEY_ID", key), ("AWS_SECRET_ACCESS_KEY", secret),
                            ("AWS_SESSION_TOKEN", token), ("AWS_REGION", region), ("AWS_ENDPOINT_URL", endpoint)):
            if value:
                opts[name] = value
        if allow_http:
            opts["AWS_ALLOW_HTTP"] = "true"
        self.storage_options = opts
        fs_args: dict[str, Any] = {}
        if key and secret:
            fs_args.update(access_key=key, secret_key=secret, session_token=token)
        if region:
            fs_args["region"] = region
        if endpoint:
            ep = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
            if ep.scheme == "http" and not allow_http:
                raise TrajlakeError(f"{text}: AWS_ENDPOINT_URL={endpoint} is plain http; set AWS_ALLOW_HTTP=true "
                                    f"to allow it")
            fs_args.update(endpoint_override=ep.netloc + ep.path.rstrip("/"), scheme=ep.scheme)
        self.fs = pafs.S3FileSystem(**fs_args)

    # -- paths -----------------------------------------------------------------------------------------------
    def path(self, *parts: str) -> str:
        """A path under the root: a local path, or ``bucket/prefix/...`` inside the S3 filesystem."""
        if self.local:
            return os.path.join(self.base, *parts)
        return "/".join([self.base, *(p.strip("/") for p in parts if p)])

    def uri_of(self, *parts: str) -> str:
        """A URI under the root for delta-rs and DuckDB (a local path for a local lake; ``az://`` on Azure)."""
        if self.local:
            return os.path.join(self.uri, *parts)
        return "/".join([self.table_base, *(p.strip("/") for p in parts if p)])

    # -- small objects ---------------------------------------------------------------------------------------
    def exists(self, *parts: str) -> bool:
        if self.fs is None:
            return os.path.exists(self.path(*parts))
        return self._call(lambda fs: fs.get_file_info(self.path(*parts)).type != pafs.FileType.NotFound, parts)

    def read_bytes(self, *parts: str) -> bytes:
        if self.fs is None:
            return Path(self.path(*parts)).read_bytes()

        def read(fs: pafs.FileSystem) -> bytes:
            with fs.open_input_stream(self.path(*parts)) as fh:
                return bytes(fh.read())

        return self._call(read, parts)

    def write_bytes(self, data: bytes, *parts: str) -> None:
        """Write a whole object atomically (local: a temporary file renamed into place; S3: one PUT)."""
        if self.fs is None:
            target = self.path(*parts)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            tmp = f"{target}.{os.getpid()}.tmp"
            with open(tmp, "wb") as fh:
                fh.write(data)
            os.replace(tmp, target)
            return

        def write(fs: pafs.FileSystem) -> None:
            with fs.open_output_stream(self.path(*parts)) as fh:
                fh.write(data)

        self._call(write, parts)

    def listdir(self, *parts: str) -> list[str]:
        """Names directly under a folder (FileNotFoundError when it does not exist locally; [] on S3)."""
        if self.fs is None:
            return os.listdir(self.path(*parts))
        sel = pafs.FileSelector(self.path(*parts), allow_not_found=True)
        return [i.base_name for i in self._call(lambda fs: fs.get_file_info(sel), parts)]

    def remove(self, *parts: str) -> None:
        """Delete one file; a missing one is not an error."""
        if self.fs is None:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.path(*parts))
            return
        if self.azure is not None:
            key = "/".join(p.strip("/") for p in parts if p)

            def delete(_: pafs.FileSystem) -> None:
                try:
                    self._object_store().delete_file(key)
                except FileNotFoundError:
                    raise
                except OSError as e:  # object_store lists the causes on the lines after its message
                    raise OSError(_causes_in_one_line(e)) from e

            with contextlib.suppress(FileNotFoundError):
                self._call(delete, parts)
            return
        with contextlib.suppress(FileNotFoundError):
            self._call(lambda fs: fs.delete_file(self.path(*parts)), parts)

    def _object_store(self) -> Any:
        """delta-rs's object_store client for this root (the commits' own client and settings), made once per
        process. Azure deletes go through it: pyarrow's AzureFileSystem.delete_file leases the blob, writes its
        folder's marker blob, deletes, then releases the lease of the blob it just deleted; that release fails
        (404) and now and then stalls ~7 s in the SDK (1 delete in 15 on Azurite), and every commit deletes its
        commit intent. object_store deletes with one request."""
        from deltalake.fs import DeltaStorageHandler

        if self._store_handler is None or self._store_handler[0] != os.getpid():  # a forked child makes its own
            self._store_handler = (os.getpid(), DeltaStorageHandler(self.table_base, self.storage_options))
        return self._store_handler[1]

    def _call(self, fn: Any, parts: tuple[str, ...]) -> Any:
        """Run an object-store call; access errors become one line naming the URI and what to set."""
        assert self.fs is not None
        try:
            return fn(self.fs)
        except FileNotFoundError:
            raise
        except OSError as e:
            raise storage_error(self.uri_of(*parts), e) from e


def _causes_in_one_line(e: BaseException) -> str:
    """An object_store error's message and the causes it lists below it (lines starting ``↳``, colour codes
    dropped) on one line, so :func:`storage_error` sees the status (``403 Forbidden``) and not only the first
    line (``Generic MicrosoftAzure error``). A backtrace that follows is left out."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in str(e).splitlines()]
    lines = [line for line in lines if line]
    causes = [line.lstrip("↳").strip() for line in lines[1:] if line.startswith("↳")]
    return "; ".join(lines[:1] + causes) or type(e).__name__


def storage_error(uri: str, e: BaseException) -> TrajlakeError:
    """One clear line for an object-store failure: the URI, the cause and, for access errors, what to set."""
    text = one_line(e)
    low = text.lower()
    azure = urlsplit(uri).scheme in AZURE_SCHEMES
    if any(s in low for s in ("access_denied", "access denied", "forbidden", "403", "signaturedoesnotmatch",
                              "invalidaccesskeyid", "lacked the necessary privileges", "credentials",
                              "authenticationfailed", "authorizationfailure")):
        return TrajlakeError(f"{uri}: access denied by the object store ({AZURE_HELP if azure else AWS_HELP})")
    if any(s in low for s in ("connection refused", "couldn't connect", "could not connect", "timed out",
                              "failed to connect", "dns", "resolve host", "error sending request")):
        where = "AZURE_STORAGE_ENDPOINT (AZURITE_BLOB_STORAGE_URL for Azurite)" if azure else "AWS_ENDPOINT_URL"
        return TrajlakeError(f"{uri}: cannot reach the object store ({text[:160]}); check {where} and the network")
    if "nosuchbucket" in low or "bucket does not exist" in low or "no such bucket" in low:
        return TrajlakeError(f"{uri}: the bucket does not exist; create it first")
    if "containernotfound" in low or "container does not exist" in low:
        return TrajlakeError(f"{uri}: the container does not exist; create it first")
    return TrajlakeError(f"{uri}: object store error: {text[:240]}")


__all__ = ["AWS_HELP", "AZURE_HELP", "AzureSettings", "LakeStorage", "is_uri", "storage_error"]
