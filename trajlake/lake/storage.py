"""Where a lake lives: a local folder or an object-store prefix (``s3://bucket/prefix``).

One object gives every layer what it needs for either: the Delta table URIs and delta-rs ``storage_options`` (the
commits), a ``pyarrow.fs`` filesystem and paths in it (the data files trajlake writes and reads itself), and
small-object helpers for ``_trajlake/`` (lake.json, commit records, policy versions). A local lake keeps the code
paths it always had: plain paths, ``filesystem=None``, ``os.replace``, fsync.

Credentials and the endpoint come from the standard AWS variables: ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION`` (or ``AWS_DEFAULT_REGION``), ``AWS_ENDPOINT_URL``
(an S3-compatible server) and ``AWS_ALLOW_HTTP`` (a plain-http endpoint). See docs/scale.md, "Object storage".
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pyarrow.fs as pafs

from trajlake.errors import TrajlakeError, one_line

S3_SCHEMES = ("s3",)
AWS_HELP = ("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for temporary keys), "
            "AWS_REGION, and AWS_ENDPOINT_URL (+ AWS_ALLOW_HTTP=true for http) for an S3-compatible server")


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


class LakeStorage:
    """The storage of one lake root (see the module docstring)."""

    def __init__(self, location: str | os.PathLike[str], env: Mapping[str, str] | None = None):
        env = os.environ if env is None else env
        self.local = not is_uri(location)
        if self.local:
            self.root_path: Path | None = Path(location).absolute()
            self.uri = str(self.root_path)
            self.fs: pafs.FileSystem | None = None  # local files keep their plain-path code paths
            self.base = self.uri
            self.storage_options: dict[str, str] | None = None
            return
        self.root_path = None
        text = str(location).rstrip("/")
        parts = urlsplit(text)
        if parts.scheme not in S3_SCHEMES:
            raise TrajlakeError(f"{text}: unsupported lake URI scheme {parts.scheme!r}; a lake is a local folder or "
                                f"s3://bucket/prefix")
        if not parts.netloc:
            raise TrajlakeError(f"{text}: no bucket; a lake on object storage is s3://bucket/prefix")
        self.uri = text
        self.base = parts.netloc + parts.path  # bucket/prefix, the path inside the S3 filesystem
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
        """A URI under the root for delta-rs and DuckDB (a local path for a local lake)."""
        if self.local:
            return os.path.join(self.uri, *parts)
        return "/".join([self.uri, *(p.strip("/") for p in parts if p)])

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
        with contextlib.suppress(FileNotFoundError):
            self._call(lambda fs: fs.delete_file(self.path(*parts)), parts)

    def _call(self, fn: Any, parts: tuple[str, ...]) -> Any:
        """Run an object-store call; access errors become one line naming the URI and what to set."""
        assert self.fs is not None
        try:
            return fn(self.fs)
        except FileNotFoundError:
            raise
        except OSError as e:
            raise storage_error(self.uri_of(*parts), e) from e


def storage_error(uri: str, e: BaseException) -> TrajlakeError:
    """One clear line for an object-store failure: the URI, the cause and, for access errors, what to set."""
    text = one_line(e)
    low = text.lower()
    if any(s in low for s in ("access_denied", "access denied", "forbidden", "403", "signaturedoesnotmatch",
                              "invalidaccesskeyid", "lacked the necessary privileges", "credentials")):
        return TrajlakeError(f"{uri}: access denied by the object store ({AWS_HELP})")
    if any(s in low for s in ("connection refused", "couldn't connect", "could not connect", "timed out",
                              "failed to connect", "dns", "resolve host")):
        return TrajlakeError(f"{uri}: cannot reach the object store ({text[:160]}); check AWS_ENDPOINT_URL "
                             f"and the network")
    if "nosuchbucket" in low or "bucket does not exist" in low or "no such bucket" in low:
        return TrajlakeError(f"{uri}: the bucket does not exist; create it first")
    return TrajlakeError(f"{uri}: object store error: {text[:240]}")


__all__ = ["AWS_HELP", "LakeStorage", "is_uri", "storage_error"]
