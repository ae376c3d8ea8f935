"""Lakes on Azure Blob Storage: how the AZURE_STORAGE_* variables and URI forms map to what delta-rs, pyarrow and
DuckDB get (no server needed), and, against Azurite on loopback, errors naming the URI and ``trajlake sql`` and
``eval`` on an ``az://`` lake. The write/read/verify/compact cycle, concurrent writers and a wrong key run for both
stores in tests/test_object_storage.py."""

from __future__ import annotations

import json
import os

import pytest

from tests.azure_server import AzuriteServer
from tests.conftest import make_episode, run_cli
from tests.test_object_storage import assert_trainer_reads_the_sql_tokens
from trajlake import Lake, LakeWriter, TrajlakeError, connect, verify
from trajlake.lake.storage import EMULATOR_ACCOUNT, EMULATOR_KEY, LakeStorage

KEY = "c2VjcmV0LWtleS1ieXRlcw=="  # base64, as Azure account keys are


def test_account_key_maps_to_every_layer() -> None:
    st = LakeStorage("az://cont/trajlake/lake/", env={"AZURE_STORAGE_ACCOUNT_NAME": "acct",
                                                       "AZURE_STORAGE_ACCOUNT_KEY": KEY})
    assert st.kind == "azure" and st.uri == "az://cont/trajlake/lake"
    assert st.uri_of("episodes") == "az://cont/trajlake/lake/episodes"
    assert st.path("episodes") == "cont/trajlake/lake/episodes"  # inside the account's AzureFileSystem
    assert st.storage_options == {"azure_storage_account_name": "acct", "azure_storage_account_key": KEY,
                                  "azure_storage_use_emulator": "false"}
    assert st.azure is not None
    assert st.azure.connection_string() == (f"DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={KEY};"
                                            f"BlobEndpoint=https://acct.blob.core.windows.net")


def test_abfss_uri_names_the_account_and_tables_are_addressed_az() -> None:
    st = LakeStorage("abfss://cont@acct.dfs.core.windows.net/p", env={"AZURE_STORAGE_SAS_TOKEN": "?sv=1&sig=x"})
    assert st.uri == "abfss://cont@acct.dfs.core.windows.net/p"  # the lake keeps the name it was given
    assert st.uri_of("turns") == "az://cont/p/turns"
    assert st.storage_options == {"azure_storage_account_name": "acct", "azure_storage_sas_key": "sv=1&sig=x",
                                  "azure_storage_use_emulator": "false"}
    assert st.azure is not None and st.azure.connection_string() == (
        "DefaultEndpointsProtocol=https;AccountName=acct;SharedAccessSignature=sv=1&sig=x;"
        "BlobEndpoint=https://acct.blob.core.windows.net")
    assert LakeStorage("abfs://cont/p", env={"AZURE_STORAGE_ACCOUNT_NAME": "a2"}).uri_of() == "az://cont/p"


def test_connection_string_and_explicit_variables() -> None:
    cs = (f"DefaultEndpointsProtocol=https;AccountName=fromcs;AccountKey={KEY};"
          f"EndpointSuffix=core.chinacloudapi.cn")
    st = LakeStorage("az://cont/p", env={"AZURE_STORAGE_CONNECTION_STRING": cs})
    assert st.storage_options is not None
    assert st.storage_options["azure_storage_account_name"] == "fromcs"
    assert st.storage_options["azure_storage_account_key"] == KEY
    assert st.storage_options["azure_storage_endpoint"] == "https://fromcs.blob.core.chinacloudapi.cn"
    # an explicit variable wins over the connection string's field
    st = LakeStorage("az://cont/p", env={"AZURE_STORAGE_CONNECTION_STRING": cs, "AZURE_STORAGE_ACCOUNT_NAME": "x"})
    assert st.storage_options is not None and st.storage_options["azure_storage_account_name"] == "x"


def test_emulator_uses_the_well_known_account_and_the_azurite_url() -> None:
    st = LakeStorage("az://cont/p", env={"AZURE_STORAGE_USE_EMULATOR": "true",
                                         "AZURITE_BLOB_STORAGE_URL": "http://127.0.0.1:12345/"})
    assert st.storage_options == {
        "azure_storage_account_name": EMULATOR_ACCOUNT, "azure_storage_account_key": EMULATOR_KEY,
        "azure_storage_endpoint": f"http://127.0.0.1:12345/{EMULATOR_ACCOUNT}", "azure_allow_http": "true",
        "azure_storage_use_emulator": "false"}
    cs = LakeStorage("az://cont/p", env={"AZURE_STORAGE_CONNECTION_STRING": "UseDevelopmentStorage=true"})
    assert cs.storage_options == {**st.storage_options,
                                  "azure_storage_endpoint": f"http://127.0.0.1:10000/{EMULATOR_ACCOUNT}"}


@pytest.mark.parametrize(("uri", "env", "message"), [
    ("az://cont/p", {}, "no Azure storage account given"),
    ("az:///p", {"AZURE_STORAGE_ACCOUNT_NAME": "a"}, "no container"),
    ("az://cont/p", {"AZURE_STORAGE_ACCOUNT_NAME": "a", "AZURE_STORAGE_ACCOUNT_KEY": "not base64!"},
     "account key is not base64"),
    ("az://cont/p", {"AZURE_STORAGE_ACCOUNT_NAME": "a", "AZURE_STORAGE_ENDPOINT": "http://h:1/a"},
     "plain http; set AZURE_ALLOW_HTTP=true"),
    ("az://cont/p", {"AZURE_STORAGE_ACCOUNT_NAME": "a", "AZURE_STORAGE_ENDPOINT": "https://other.example/x"},
     "neither https://a.<host> nor"),
    ("gs://bucket/lake", {}, "az://container/prefix (Google Cloud Storage lakes are not supported yet"),
])
def test_bad_azure_settings_are_one_line_naming_the_uri(uri: str, env: dict[str, str], message: str) -> None:
    with pytest.raises(TrajlakeError) as e:
        LakeStorage(uri, env=env)
    assert message in str(e.value) and str(e.value).startswith(uri.rstrip("/")) and "\n" not in str(e.value)
    if "account" in message:
        assert "AZURE_STORAGE_ACCOUNT_NAME" in str(e.value)


def test_missing_container_names_the_uri(az_lake_uri: str) -> None:
    uri = "az://no-such-container/lake"
    with pytest.raises(TrajlakeError, match="container does not exist"):
        Lake.init(uri)
    with pytest.raises(TrajlakeError, match="not a trajlake lake"):
        Lake.open(az_lake_uri)


def test_remove_is_one_delete_without_a_folder_marker(az_lake_uri: str) -> None:
    """Deleting a folder's last file (every commit deletes its commit intent) goes through object_store: one
    delete, no folder marker left behind (pyarrow's delete_file writes one, leases the blob and releases the lease
    of the deleted blob, a request that stalled ~7 s in 1 delete of 15 on Azurite). Missing files are no error; a
    wrong key is one access-denied line."""
    import time

    container = az_lake_uri.removeprefix("az://").split("/", 1)[0]
    st = LakeStorage(az_lake_uri)
    st.write_bytes(b"{}", "_trajlake", "intents", "episodes", "n0")
    st.remove("_trajlake", "intents", "episodes", "n0")
    assert st.listdir("_trajlake", "intents", "episodes") == []
    assert not st.exists("_trajlake", "intents", "episodes")  # pyarrow's delete leaves "intents/episodes/"
    st.remove("_trajlake", "intents", "episodes", "n0")  # already gone
    started = time.monotonic()
    for i in range(15):
        st.write_bytes(b"{}", "_trajlake", "intents", "turns", f"n{i}")
        st.remove("_trajlake", "intents", "turns", f"n{i}")
    assert time.monotonic() - started < 30  # ~0.3 s idle; a stall would be ~7 s a delete
    st.write_bytes(b"{}", "k")
    wrong = LakeStorage(az_lake_uri, env={**os.environ, "AZURE_STORAGE_ACCOUNT_KEY": KEY})
    with pytest.raises(TrajlakeError) as e:
        wrong.remove("k")
    assert "access denied" in str(e.value) and "\n" not in str(e.value) and container in str(e.value)
    assert st.exists("k")


@pytest.mark.slow
def test_az_sas_token_and_abfss_spelling(az_lake_uri: str, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """A SAS token instead of the key reaches every layer (delta-rs commits, pyarrow files, DuckDB queries); a
    lake written as abfss:// reads back as az://; a SAS with a wrong signature is one access-denied line."""
    monkeypatch.setenv("AZURE_STORAGE_SAS_TOKEN", "?" + AzuriteServer.account_sas())
    container_path = az_lake_uri.removeprefix("az://")
    lake = Lake.init(f"abfss://{container_path}")
    assert lake.storage.storage_options is not None and "azure_storage_account_key" not in lake.storage.storage_options
    with LakeWriter(lake, handle_signals=False) as w:
        for i in range(3):
            ep, turns = make_episode(f"sas-{i}", run_id="run-sas", n_steps=2)
            w.write_batch([ep], turns)
            w.flush()
    code, out, err = run_cli(capsys, "sql", "--lake", az_lake_uri, "-f", "csv",
                             "select count(*), sum(n_turns) from episodes")
    assert code == 0, err
    assert out.strip().splitlines()[1:] == ["3,15"]
    assert connect(lake).execute("select count(*) from turns").fetchone() == (15,)
    assert verify(Lake.open(az_lake_uri)).ok
    monkeypatch.setenv("AZURE_STORAGE_SAS_TOKEN", AzuriteServer.account_sas(key="d3Jvbmcta2V5LWZvci1zaWduaW5n"))
    with pytest.raises(TrajlakeError) as e:
        Lake.open(az_lake_uri)
    assert str(e.value).startswith(az_lake_uri) and "access denied" in str(e.value) and "\n" not in str(e.value)
    assert "AZURE_STORAGE_SAS_TOKEN" in str(e.value)


@pytest.mark.slow
def test_az_sql_eval_and_trainer_reader(az_lake_uri: str, capsys: pytest.CaptureFixture[str]) -> None:
    """rollout writes two runs through the CLI; ``trajlake sql`` and ``eval`` read them back through DuckDB, the
    trainer's reader through pyarrow."""
    from trajlake.envs import list_tasks

    uri = az_lake_uri
    # tool-lookup's short episodes: the storage paths are under test, not the environment (as in
    # tests/test_object_storage.py::test_s3_every_command; tests/test_s3_commands.py plays Mini SWE into a lake)
    tasks = ",".join(t["task_id"] for t in list_tasks("tool-lookup", "dev")[:2])
    for policy in ("oracle", "random"):
        code, _, err = run_cli(capsys, "rollout", "--lake", uri, "--env", "tool-lookup", "--policy", policy,
                               "--seeds", "0", "--tasks", tasks, "--run-id", policy, "--workers", "1",
                               "--commit-every", "0")
        assert code == 0, err
    code, out, err = run_cli(capsys, "sql", "--lake", uri, "-f", "csv",
                             "select run_id, count(*), count(distinct task_id) from episodes group by run_id "
                             "order by run_id")
    assert code == 0, err
    assert out.strip().splitlines()[1:] == ["oracle,2,2", "random,2,2"]
    code, out, err = run_cli(capsys, "eval", "--lake", uri, "--baseline", "random", "--candidate", "oracle",
                             "--format", "json", "--resamples", "50")
    assert code == 0, err
    report = json.loads(out)
    assert report["lake"] == uri
    assert report["lake_versions"] == connect(uri).execute(
        "select map_from_entries(list((table_name, version))) from lake_versions").fetchone()[0]
    for run in ("oracle", "random"):
        assert report["runs"][run]["n_episodes"] == 2 and report["runs"][run]["n_tasks"] == 2
    # the demo's runs carry token ids (the rollouts above are text-only)
    code, _, err = run_cli(capsys, "demo", "--lake", uri, "--seeds", "1", "--tasks", "2")
    assert code == 0, err
    assert_trainer_reads_the_sql_tokens(uri, "demo-R1")
