"""A real S3 API on loopback for the object-storage tests: moto's server mode (``moto[server]``, a dev
dependency) in a child process on a free port, with authentication on, so a wrong key is refused as AWS would, and
conditional puts atomic, as S3's are (``tests.moto_atomic``)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.servers import free_port, wait_until_up

_REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    access_key: str
    secret_key: str
    region: str = "us-east-1"

    def env(self) -> dict[str, str]:
        """The AWS_* variables a trajlake process needs to reach this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ALLOW_HTTP": "true", "AWS_REGION": self.region,
                "AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key}

    def client(self) -> object:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.access_key,
                            aws_secret_access_key=self.secret_key, region_name=self.region)


@contextlib.contextmanager
def start_moto() -> Iterator[S3Server]:
    """moto's S3 server in a child process on a free loopback port, with IAM authentication on after the first
    3 requests (which create the user and key this yields); stopped on exit."""
    import boto3

    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "3"}
    # tests.moto_atomic: moto's server with its conditional puts made atomic, as S3's are
    proc = subprocess.Popen([sys.executable, "-m", "tests.moto_atomic", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=_REPO)
    try:
        wait_until_up(proc, lambda: urllib.request.urlopen(endpoint + "/moto-api/", timeout=2).close(),
                      "moto server")
        iam = boto3.client("iam", endpoint_url=endpoint, aws_access_key_id="bootstrap",
                           aws_secret_access_key="bootstrap", region_name="us-east-1")
        iam.create_user(UserName="trajlake-test")
        iam.put_user_policy(UserName="trajlake-test", PolicyName="all", PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
        key = iam.create_access_key(UserName="trajlake-test")["AccessKey"]
        yield S3Server(endpoint, key["AccessKeyId"], key["SecretAccessKey"])
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    pytest.importorskip("moto.server", reason="the object-storage tests need moto[server] (the dev extra)")
    with start_moto() as server:
        yield server


_BUCKETS = iter(range(10**6))


def new_s3_lake_uri(server: S3Server, monkeypatch: pytest.MonkeyPatch) -> str:
    """A new empty bucket, the AWS_* variables pointing at ``server`` (set through ``monkeypatch``, so undone with
    it), and the URI of a lake in it. For a lake shared by a module's tests, pass a module-scoped MonkeyPatch."""
    bucket = f"lake-{os.getpid()}-{next(_BUCKETS)}"
    server.client().create_bucket(Bucket=bucket)  # type: ignore[attr-defined]
    for k, v in server.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return f"s3://{bucket}/trajlake/lake"


@pytest.fixture
def s3_lake_uri(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> str:
    """A new empty bucket, the AWS_* variables pointing at the server, and the URI of a lake in it."""
    return new_s3_lake_uri(s3_server, monkeypatch)
