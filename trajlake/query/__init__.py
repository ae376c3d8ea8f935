"""Query the lake: ``connect`` gives an in-process DuckDB connection with one view per table, ``scan`` a Polars
LazyFrame. Both read through the Delta log (DuckDB's ``delta`` extension, delta-rs for Polars), can be pinned
to table versions, and apply the commit point: turns and gateway events appear only once their episode row
exists. Nothing loads a whole table into Python memory.

``connect(lake, read_only=True)`` (what ``trajlake sql`` uses, through :func:`run_read_only`) locks the
connection down: file access only to the lake and the extension folder, no extension auto-install or loading,
and a locked configuration that no query can turn back. :func:`run_read_only` also accepts only one read
statement (SELECT, EXPLAIN), classified by DuckDB's own parser. Python callers get the writable default
(``read_only=False``: temp tables, ``SET``, any file) because they already run arbitrary code; see
``docs/security.md``.
"""

from __future__ import annotations

import functools
import os
import pathlib
import tempfile
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import duckdb

from trajlake.errors import QueryError, TrajlakeError
from trajlake.lake.storage import EMULATOR_ACCOUNT, storage_error
from trajlake.lake.store import Lake, LakeArg, as_lake
from trajlake.schema import TABLES, table_def

if TYPE_CHECKING:
    import polars as pl

__all__ = ["READ_STATEMENT_TYPES", "check_read_only_sql", "connect", "lake_versions", "lock_down", "run_query",
           "scan", "sql_literal"]

_COMMITTED_BY_EPISODE = ("turns", "gateway_events")


def _extension_dir(lk: Lake) -> str:
    """DuckDB extension directory: inside the lake when writable, else a per-user temp folder (never $HOME)."""
    alt = pathlib.Path(tempfile.gettempdir()) / f"trajlake-duckdb-ext-{os.getuid()}"
    if not lk.is_local:
        alt.mkdir(parents=True, exist_ok=True)
        return str(alt)
    d = lk.meta_dir / "duckdb_extensions"
    try:
        d.mkdir(parents=True, exist_ok=True)
        probe = d / ".probe"
        probe.touch()
        probe.unlink()
        return str(d)
    except OSError:
        alt.mkdir(parents=True, exist_ok=True)
        return str(alt)


#: Extension files DuckDB loaded with their signature checked in this process: path -> the file's identity then
#: (:func:`_file_identity`). Checking a signature hashes the whole file (delta's is 82 MB): ~0.4 s a connection on
#: an idle core, 1-2 s on a loaded one, paid by every :func:`connect`. A writable connection (whose caller runs
#: its own code anyway) loads a file verified here, unchanged since, from the same path without the check; a
#: read-only one (untrusted SQL) always checks.
_VERIFIED_EXTENSIONS: dict[str, tuple[int, ...]] = {}


def _file_identity(path: pathlib.Path) -> tuple[int, ...]:
    """What changes when a file is replaced or written: device, inode, size, mtime and ctime (ns); ctime moves
    on any write or utime, so a file cannot be swapped in looking like the verified one."""
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _is_verified(ext: pathlib.Path) -> bool:
    try:
        return _VERIFIED_EXTENSIONS.get(str(ext)) == _file_identity(ext)
    except OSError:
        return False


@functools.cache
def _duckdb_library_version() -> str:
    """DuckDB's library version as its extension folders name it (``v1.5.5``)."""
    row = duckdb.connect(":memory:").sql("PRAGMA version").fetchone()
    assert row is not None
    return str(row[0])


def _bundled_file(name: str, package_dir: pathlib.Path, extra: str) -> pathlib.Path:
    """The extension file of duckdb-extension-NAME for this DuckDB (the package is pinned to its version)."""
    version = _duckdb_library_version()
    ext = package_dir / "extensions" / version / f"{name}.duckdb_extension"
    if not ext.exists():
        raise TrajlakeError(
            f"DuckDB {version} has no bundled {name} extension at {ext}; install duckdb and "
            f"duckdb-extension-{name} of the same version (pip install '{extra}')")
    return ext


def _delta_file() -> pathlib.Path:
    import duckdb_extension_delta

    return _bundled_file("delta", pathlib.Path(duckdb_extension_delta.__file__).parent, "trajlake")


def _store_extension_file(lk: Lake) -> pathlib.Path:
    """The extension an object-store lake's connection needs: duckdb-extension-azure or -httpfs, dependencies
    of trajlake pinned to the DuckDB version."""
    import importlib

    name = "azure" if lk.storage.kind == "azure" else "httpfs"
    try:
        package = importlib.import_module(f"duckdb_extension_{name}")
    except ImportError as e:
        raise TrajlakeError(f"{lk.location}: querying this lake needs duckdb-extension-{name}: "
                            f"pip install 'trajlake'") from e
    return _bundled_file(name, pathlib.Path(str(package.__file__)).parent, "trajlake")


def _load_delta(con: duckdb.DuckDBPyConnection) -> None:
    _load_bundled(con, _delta_file())


def _load_bundled(con: duckdb.DuckDBPyConnection, ext: pathlib.Path) -> None:
    """Load an extension file shipped in its PyPI package (never downloaded at run time), by its path: never a
    same-named file in the extension folder. Remembered as verified when the connection checked its signature."""
    identity = _file_identity(ext)
    con.execute(f"LOAD {sql_literal(str(ext))}")
    row = con.execute("SELECT current_setting('allow_unsigned_extensions')").fetchone()
    if row is not None and row[0] is False:
        _VERIFIED_EXTENSIONS[str(ext)] = identity


def _attach_object_store(con: duckdb.DuckDBPyConnection, lk: Lake) -> None:
    """The store's extension (from its PyPI package) and a secret made from the lake's settings."""
    _load_bundled(con, _store_extension_file(lk))
    if lk.storage.kind == "azure":
        _attach_azure(con, lk)
    else:
        _attach_s3(con, lk)


def _attach_s3(con: duckdb.DuckDBPyConnection, lk: Lake) -> None:
    """An S3 secret (httpfs is loaded) from the lake's AWS_* settings."""
    opts = lk.storage.storage_options or {}
    parts = ["TYPE s3"]
    for key, name in (("AWS_ACCESS_KEY_ID", "KEY_ID"), ("AWS_SECRET_ACCESS_KEY", "SECRET"),
                      ("AWS_SESSION_TOKEN", "SESSION_TOKEN"), ("AWS_REGION", "REGION")):
        if opts.get(key):
            parts.append(f"{name} {sql_literal(opts[key])}")
    endpoint = opts.get("AWS_ENDPOINT_URL")
    if endpoint:
        ep = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
        # a custom endpoint (MinIO, moto, R2) serves path-style URLs; AWS itself takes the default
        parts += [f"ENDPOINT {sql_literal(ep.netloc + ep.path.rstrip('/'))}", "URL_STYLE 'path'",
                  f"USE_SSL {'false' if ep.scheme == 'http' else 'true'}"]
    con.execute(f"CREATE SECRET trajlake_lake ({', '.join(parts)})")


def _attach_azure(con: duckdb.DuckDBPyConnection, lk: Lake) -> None:
    """An azure secret (the azure extension is loaded): a connection string from the lake's AZURE_* settings,
    else the credential chain (managed identity, az login, the AZURE_CLIENT_* variables)."""
    az = lk.storage.azure
    assert az is not None
    if az.account == EMULATOR_ACCOUNT:
        # the delta extension sends the well-known emulator account to object_store's emulator mode, which
        # takes its URL from this variable only (default http://127.0.0.1:10000)
        os.environ.setdefault("AZURITE_BLOB_STORAGE_URL", az.account_url.rsplit("/", 1)[0])
    cs = az.connection_string()
    if cs is not None:
        con.execute(f"CREATE SECRET trajlake_lake (TYPE azure, CONNECTION_STRING {sql_literal(cs)})")
    else:
        con.execute(f"CREATE SECRET trajlake_lake (TYPE azure, PROVIDER credential_chain, "
                    f"ACCOUNT_NAME {sql_literal(az.account)})")


def sql_literal(value: object) -> str:
    """A SQL string literal (the one place quoting is written; DuckDB doubles single quotes)."""
    return "'" + str(value).replace("'", "''") + "'"


def _select_list(con: duckdb.DuckDBPyConnection, name: str, src: str) -> str:
    """The view's columns in schema order. A table written under an older minor schema version lacks the
    columns added since: they read as typed nulls, so queries never depend on when a lake was written."""
    have = {r[0] for r in con.execute(f"DESCRIBE SELECT * FROM {src}").fetchall()}
    out = []
    for c in table_def(name).columns:
        if c.name in have:
            out.append(f'"{c.name}"')
        else:
            out.append(f'CAST(NULL AS {_duckdb_type(c.arrow_type)}) AS "{c.name}"')
    return ", ".join(out)


def _duckdb_type(t: Any) -> str:
    import pyarrow as pa

    simple = {pa.string(): "VARCHAR", pa.int32(): "INTEGER", pa.int64(): "BIGINT", pa.int8(): "TINYINT",
              pa.float32(): "FLOAT", pa.float64(): "DOUBLE", pa.bool_(): "BOOLEAN"}
    if t in simple:
        return simple[t]
    if pa.types.is_timestamp(t):
        return "TIMESTAMP WITH TIME ZONE"
    if pa.types.is_list(t):
        return _duckdb_type(t.value_type) + "[]"
    if pa.types.is_map(t):
        return f"MAP({_duckdb_type(t.key_type)}, {_duckdb_type(t.item_type)})"
    if pa.types.is_struct(t):
        return "STRUCT(" + ", ".join(f'"{f.name}" {_duckdb_type(f.type)}' for f in t) + ")"
    raise TrajlakeError(f"no DuckDB type for {t}")


def connect(lake: LakeArg, as_of: str | dict[str, int] | None = None, *,
            memory_limit: str | None = None, threads: int | None = None,
            read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """An in-process DuckDB connection with views ``episodes``, ``turns``, ``tasks``, ``runs``,
    ``gateway_events`` (committed data only) and ``turns_uncommitted`` (orphans and in-flight rows).

    ``as_of`` pins table versions (``{"episodes": 3, ...}``, ``"episodes=3,turns=5"`` or an ISO timestamp);
    the versions read are in the connection's ``lake_versions`` table.

    With ``read_only`` the connection can read files only under the lake and the extension folder, cannot
    load extensions and has its configuration locked. It can still run any statement DuckDB allows inside
    those folders (a ``COPY ... TO`` into the lake, for one): pass untrusted SQL through
    :func:`run_read_only`, which accepts read statements only."""
    lk = as_lake(lake)
    versions = lk.resolve_as_of(as_of) or lk.versions()
    extensions = [_delta_file()] if lk.is_local else [_store_extension_file(lk), _delta_file()]
    config: dict[str, Any] = {
        "autoinstall_known_extensions": False,
        "autoload_known_extensions": False,
        # the signatures of these files were checked by an earlier connection of this process (see
        # _VERIFIED_EXTENSIONS); never for read_only, whose SQL may come from someone else
        "allow_unsigned_extensions": not read_only and all(_is_verified(e) for e in extensions),
        "extension_directory": _extension_dir(lk),
        # spill files of large queries go next to the extensions, never into the caller's working directory
        "temp_directory": str(pathlib.Path(_extension_dir(lk)).parent / "duckdb_tmp"),
    }
    if memory_limit:
        config["memory_limit"] = memory_limit
    if threads:
        config["threads"] = threads
    con = duckdb.connect(":memory:", config=config)
    if not lk.is_local:
        _attach_object_store(con, lk)
    _load_delta(con)
    for name in TABLES:
        # each table attached at its pinned version with its snapshot kept for the connection's life: a
        # delta_scan() view would read the Delta log again for every statement (a listing and several GETs on an
        # object store: 2.5-3.5x a small query's time on moto's S3); the pinned version makes caching it exact
        src = f"_delta_{name}"
        try:
            con.execute(f"ATTACH {sql_literal(lk.table_uri(name))} AS {src} "
                        f"(TYPE delta, PIN_SNAPSHOT, VERSION {int(versions[name])})")
            cols = _select_list(con, name, src)
        except duckdb.Error as e:
            if lk.is_local:
                raise
            raise storage_error(lk.table_uri(name), e) from e
        if name in _COMMITTED_BY_EPISODE:
            con.execute(f"CREATE VIEW _{name}_all AS SELECT {cols} FROM {src}")
            con.execute(f"CREATE VIEW {name} AS SELECT * FROM _{name}_all "
                        f"WHERE episode_id IN (SELECT episode_id FROM episodes)")
        else:
            con.execute(f"CREATE VIEW {name} AS SELECT {cols} FROM {src}")
    con.execute("CREATE VIEW turns_uncommitted AS SELECT * FROM _turns_all "
                "WHERE episode_id NOT IN (SELECT episode_id FROM episodes)")
    con.execute("CREATE TABLE lake_versions (table_name VARCHAR, version BIGINT)")
    con.executemany("INSERT INTO lake_versions VALUES (?, ?)", list(versions.items()))
    if read_only:
        _lock_down(con, lk)
    return con


def _lock_down(con: duckdb.DuckDBPyConnection, lk: Lake) -> None:
    """Limit file access to the lake and the extension folder, forbid extension loading, lock the settings."""
    ext = con.execute("SELECT current_setting('extension_directory')").fetchone()
    assert ext is not None
    lake_dir = str(lk.root.resolve()) if lk.is_local else lk.storage.uri_of()
    lock_down(con, [lake_dir + "/", str(pathlib.Path(str(ext[0])).resolve()) + "/"])


def lock_down(con: duckdb.DuckDBPyConnection, allowed_directories: Sequence[str] = ()) -> None:
    """Lock ``con`` for untrusted SQL: files only under ``allowed_directories`` (none: no file access), no extension
    installed or loaded (community ones included), and a configuration no later statement can change."""
    if allowed_directories:
        con.execute("SET allowed_directories = [" + ", ".join(sql_literal(d) for d in allowed_directories) + "]")
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    con.execute("SET enable_external_access = false")
    con.execute("SET allow_community_extensions = false")
    con.execute("SET lock_configuration = true")


READ_STATEMENT_TYPES = frozenset({duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN})
"""Statement types :func:`run_read_only` accepts (``SHOW``, ``DESCRIBE``, ``SUMMARIZE`` and ``FROM x`` parse
as SELECT)."""


def check_read_only_sql(query: str) -> duckdb.Statement:
    """The single read statement of ``query``, or QueryError naming what is refused. ``EXPLAIN ANALYZE`` runs its
    statement, so the statement an EXPLAIN explains must itself be a SELECT."""
    statement = _one_statement(query)
    _require_read(statement)
    if statement.type == duckdb.StatementType.EXPLAIN:
        inner = _one_statement(_explained_text(statement.query))
        if inner.type != duckdb.StatementType.SELECT:
            kind = str(inner.type).rsplit(".", 1)[-1]
            raise QueryError(f"EXPLAIN runs or plans only SELECT here; this explains a {kind} statement")
    return statement


def _one_statement(query: str) -> duckdb.Statement:
    if not query.strip():
        raise QueryError("empty query: give a SQL statement, e.g. \"select count(*) from episodes\"")
    try:
        statements = duckdb.extract_statements(query)
    except duckdb.Error as e:
        raise QueryError(str(e).splitlines()[0]) from None
    if not statements:
        raise QueryError("no SQL statement in the query")
    if len(statements) > 1:
        raise QueryError(f"give one SQL statement, got {len(statements)}")
    return statements[0]


def _require_read(statement: duckdb.Statement) -> None:
    if statement.type not in READ_STATEMENT_TYPES:
        kind = str(statement.type).rsplit(".", 1)[-1]
        raise QueryError(f"only read statements (SELECT, EXPLAIN) are allowed; this is a {kind} statement")


def _explained_text(query: str) -> str:
    """The statement after ``EXPLAIN [ANALYZE] [(options)]`` in ``query``, found with DuckDB's own tokenizer
    (which skips comments); a layout it does not know is refused rather than guessed."""
    tokens = [start for start, _ in duckdb.tokenize(query)]

    def word(i: int, *options: str) -> bool:
        rest = query[tokens[i]:tokens[i] + 8].lower()
        return any(rest.startswith(o) and not rest[len(o):len(o) + 1].isalnum() for o in options)

    if not tokens or not word(0, "explain"):
        raise QueryError("EXPLAIN: cannot find the statement it explains; write EXPLAIN [ANALYZE] SELECT ...")
    i = 1
    if i < len(tokens) and word(i, "analyze", "analyse"):
        i += 1
    if i < len(tokens) and query[tokens[i]] == "(":  # EXPLAIN (option, ...): skip to the closing parenthesis
        depth = 0
        while i < len(tokens):
            depth += {"(": 1, ")": -1}.get(query[tokens[i]], 0)
            i += 1
            if depth == 0:
                break
    if i >= len(tokens):
        raise QueryError("EXPLAIN: cannot find the statement it explains; write EXPLAIN [ANALYZE] SELECT ...")
    return query[tokens[i]:]


SQL_TIMEOUT_S = 300.0
"""``trajlake sql``'s default statement timeout in seconds (``--timeout``; 0: none)."""


def run_query(lake: LakeArg, query: str, as_of: str | dict[str, int] | None = None, *,
              memory_limit: str | None = None,
              timeout_s: float = SQL_TIMEOUT_S) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run one untrusted read statement over the lake's views (``trajlake sql``) on a locked-down connection:
    (column names, rows). A refused statement, a DuckDB error or a statement still running after ``timeout_s``
    seconds (0: no limit; DuckDB is interrupted) becomes a one-line ``QueryError``."""
    import threading

    if not timeout_s >= 0:
        raise QueryError(f"--timeout {timeout_s}: give a number of seconds >= 0 (0: no limit)")
    statement = check_read_only_sql(query)
    con = connect(lake, as_of, memory_limit=memory_limit, read_only=True)
    timer = threading.Timer(timeout_s, con.interrupt) if timeout_s > 0 else None
    try:
        if timer is not None:
            timer.start()
        rel = con.execute(statement)
        cols = [d[0] for d in rel.description] if rel.description else []
        rows = rel.fetchall() if cols else []
    except duckdb.InterruptException as e:
        raise QueryError(f"the query ran longer than {timeout_s:g} s and was stopped (--timeout SECONDS to allow "
                         "more; 0: no limit)") from e
    except duckdb.Error as e:
        raise QueryError(str(e).splitlines()[0]) from e
    finally:
        if timer is not None:
            timer.cancel()
        con.close()
    return cols, rows


def lake_versions(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """Table versions a ``connect`` connection reads."""
    return {str(t): int(v) for t, v in con.execute("SELECT table_name, version FROM lake_versions").fetchall()}


def scan(lake: LakeArg, table: str, as_of: str | dict[str, int] | None = None) -> pl.LazyFrame:
    """A Polars LazyFrame over ``table`` (committed rows only), optionally pinned with ``as_of``."""
    import polars as pl

    lk = as_lake(lake)
    if table not in TABLES:
        raise QueryError(f"unknown table {table!r}; tables are {', '.join(TABLES)}")
    versions = lk.resolve_as_of(as_of) or lk.versions()
    cols = table_def(table).column_names

    def raw(name: str) -> pl.LazyFrame:
        return pl.scan_delta(lk.table_uri(name), version=versions[name], storage_options=lk.storage.storage_options)

    base = raw(table)
    have = set(base.collect_schema().names())
    if have.issuperset(cols):
        lf = base.select(cols)
    else:  # written under an older minor schema version: the columns added since read as typed nulls
        empty = pl.from_arrow(table_def(table).arrow_schema().empty_table())
        assert isinstance(empty, pl.DataFrame)
        lf = base.select([pl.col(c) if c in have else pl.lit(None, dtype=empty.schema[c]).alias(c) for c in cols])
    if table in _COMMITTED_BY_EPISODE:
        lf = lf.join(raw("episodes").select("episode_id"), on="episode_id", how="semi")
    return lf
