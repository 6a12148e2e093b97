"""A simulated year of nightly re-tunes: database and mirror sizes with retention off and on.

    .venv/bin/python bench/retention.py [--nights 365] [--keys 50] [--module-bytes 16384]
                                        [--modules 1] [--keep 10] [--mirror-max-bytes 4194304]
                                        [--postgres-url URL] [--no-postgres] [--no-vacuum]
                                        [--exact] [--json PATH]

Every night each of ``--keys`` keys is re-tuned once. The first night's runs are recorded
with :func:`tunecache.service.publishing.record_run` (``force``: the promotion policy's diff
against the current run is skipped, it decides nothing here) after their artifacts are stored
with :func:`tunecache.service.blobs.store_blob`, as ``POST /v1/tunings`` and ``PUT
/v1/artifacts`` do; every later night writes the same rows in bulk, a table at a time
(``_record_night_in_bulk``: each run a copy of its key's first run but for its time and
modules, made current), because ``record_run`` costs about 20 ms a run on this machine and
four stores of a year would take half an hour (``--exact``: every run through ``record_run``).
Each run holds:

* its FlashInfer autotune file: the real H200 file of ``tests/fixtures`` (20 KB), the same
  every night, so it is stored once (content addressing);
* ``--modules`` JIT modules of ``--module-bytes`` each, new random bytes every run (a JIT
  module of a re-tune is new bytes whenever anything it was built from moved; the worst case
  for the store). The issue's nights carry ~15 MB of modules per run; the default here is
  16 KiB, so that the four stores of one bench run write ~1.2 GB in all and finish in
  minutes on two cores. Nothing is extrapolated: the figures printed are those measured
  with the sizes printed beside them.

Then the node's pods download the new runs' artifacts: each is mirrored into the artifact
files (:meth:`tunecache.service.artifact_files.ArtifactFiles.mirror`), as the first download on a
node does.

Each database gets two stores, one after the other in the same bench run:

* ``off``: what the service did before retention: every run and blob kept, the mirror never
  trimmed (``TUNECACHE_RUN_RETENTION=off``, and no pass runs);
* ``on``: a retention pass (:func:`tunecache.service.retention.run_pass`) after each night,
  ten hours after the runs were recorded, with ``--keep`` runs per key (default 10, the
  service's default), the service's grace (one hour) and ``--mirror-max-bytes``.

The simulated clock: ``repository.utcnow`` and ``blobs.utcnow`` are replaced by a clock at
the night's date (runs' and blobs' ``created_at``), and the pass gets its ``now``. The mirror
orders its files by their access time on the real clock (written in night order), and the
"used within the last minute" protection is off here (``artifact_files.IN_USE_S = 0``: in the
service a file is at most a minute younger than its use; here a whole year is written in
minutes).

On PostgreSQL each night ends with a plain ``VACUUM`` of the tables it changed, with the
policy off and on: it stands in for autovacuum in the day between two nights (here a night
passes in about a second, and autovacuum wakes once a minute), which makes the space of
deleted rows reusable; without it (``--no-vacuum``) the files grow as if nothing were ever
deleted. ``VACUUM FULL`` (giving space back) is never run.

Sizes: SQLite: the database file after a WAL checkpoint (SQLite reuses freed pages but does
not shrink the file without ``VACUUM``, which the service never runs) and the bytes of its
pages in use; PostgreSQL: ``pg_total_relation_size`` of every table of the bench's schema
(indexes and TOAST included; dead rows count until autovacuum reclaims their space for
reuse, as in the service), in a schema of its own (``tunecache_bench_retention_*``) dropped
afterwards; the mirror: bytes of its files. Prints one table; ``--json PATH`` writes it as
JSON too. A figure here is a measurement of this machine, not a test.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import io
import json
import os
import random
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

from sqlalchemy import create_engine, func, insert, select, text, update

from tunecache.contract import ArtifactKind, TuningKey, TuningRunCreate
from tunecache.formats.autotune_file import parse_autotune_file
from tunecache.service import artifact_files, blobs, db, publishing, repository
from tunecache.service.artifact_files import ArtifactFiles
from tunecache.service.models import (ArtifactBlob, ArtifactChunk, CurrentTuning, RunArtifact, TuningGeneration,
                                      TuningRun)
from tunecache.service.retention import RetentionPolicy, run_pass

ROOT = Path(__file__).resolve().parents[1]
AUTOTUNE_FILE = ROOT / "tests" / "fixtures" / "flashinfer-0.7.4-h200" / "mm_bf16-cudnn.json"
DEFAULT_POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
START = dt.datetime(2026, 1, 1, 2, 0, tzinfo=dt.timezone.utc)


class Clock:
    """The simulated time of the stores' ``utcnow``."""

    now = START

    def __call__(self) -> dt.datetime:
        return self.now


def _keys(count: int) -> list[TuningKey]:
    return [TuningKey(gpu_name="NVIDIA H200", arch="sm90", model=f"bench/model-{i // 4}",
                      max_num_batched_tokens=(2048, 4096, 8192, 16384)[i % 4]) for i in range(count)]


def _store(session, data: bytes) -> str:
    return blobs.store_blob(session, io.BytesIO(data), hashlib.sha256(data).hexdigest()).sha256


def simulate(kind: str, url: str, policy: RetentionPolicy | None, args, workdir: Path) -> dict:
    """One store: ``args.nights`` nights of ``args.keys`` runs; ``policy`` ``None``: off."""
    clock = Clock()
    repository.utcnow = blobs.utcnow = clock
    engine = db.create_db_engine(url)
    db.upgrade(engine)
    sessions = db.session_factory(engine)
    mirror = workdir / f"mirror-{kind}-{'on' if policy else 'off'}"
    files = ArtifactFiles(mirror)
    autotune = AUTOTUNE_FILE.read_bytes()
    environment = parse_autotune_file(autotune).environment
    keys = _keys(args.keys)
    rng = random.Random(args.seed)
    began = time.monotonic()
    pass_seconds = 0.0
    deleted = {"runs": 0, "blobs": 0, "mirror_files": 0}
    templates: list[TuningRun] = []
    for night in range(args.nights):
        clock.now = START + dt.timedelta(days=night)
        new: list[str] = []
        with sessions.begin() as session:
            autotune_sha = _store(session, autotune)
            if night == 0 or args.exact:
                for key in keys:
                    modules = [_store(session, rng.randbytes(args.module_bytes)) for _ in range(args.modules)]
                    run = TuningRunCreate.model_validate({
                        "key": key.model_dump(), "environment": environment.model_dump(), "trigger": "http",
                        "summary": {"entries": 42}, "node": "bench-node",
                        "artifacts": [{"kind": ArtifactKind.FLASHINFER_AUTOTUNE.value, "name": "autotune.json",
                                       "media_type": "application/json", "sha256": autotune_sha}]
                        + [{"kind": "flashinfer_jit_module", "name": f"module-{m}.tar.gz", "media_type": "application/gzip",
                            "sha256": sha} for m, sha in enumerate(modules)],
                    })
                    templates.append(session.get(TuningRun, publishing.record_run(session, run, force=True).id))
                    new += modules
                templates = templates[-len(keys):]
            else:
                new = _record_night_in_bulk(session, templates, [[rng.randbytes(args.module_bytes) for _ in range(args.modules)]
                                                                 for _ in keys], clock.now)
        with sessions.begin() as session:  # the pods of the node download the new runs
            for sha in [autotune_sha] + new:
                if files.get(sha) is None:
                    files.mirror(session, sha)
        if policy is not None:
            started = time.monotonic()
            report = run_pass(sessions, files, policy, now=clock.now + dt.timedelta(hours=10))
            pass_seconds += time.monotonic() - started
            deleted["runs"] += len(report.runs)
            deleted["blobs"] += len(report.blobs.blobs)
            deleted["mirror_files"] += report.mirror.files
        if kind == "postgresql" and not args.no_vacuum:
            _vacuum(engine)
        if (night + 1) % 30 == 0 or night + 1 == args.nights:
            print(f"  {kind} {'on' if policy else 'off'}: night {night + 1}/{args.nights}, "
                  f"{time.monotonic() - began:.0f} s", file=sys.stderr, flush=True)
    elapsed = time.monotonic() - began
    with sessions.begin() as session:
        runs = session.scalar(select(func.count()).select_from(TuningRun))
        blob_count = session.scalar(select(func.count()).select_from(ArtifactBlob))
        blob_bytes = session.scalar(select(func.coalesce(func.sum(ArtifactBlob.size_bytes), 0)))
    sizes = _database_size(engine)
    engine.dispose()
    result = {
        "database": kind, "policy": f"on (keep {policy.keep}, mirror cap {policy.mirror_max_bytes:,} B)" if policy else "off",
        "runs": runs, "blobs": blob_count, "blob_bytes": int(blob_bytes), **sizes,
        "mirror_files": sum(1 for _ in mirror.rglob("*") if _.is_file()) if mirror.exists() else 0,
        "mirror_bytes": files.size(), "deleted": deleted,
        "seconds": round(elapsed, 1), "pass_seconds": round(pass_seconds, 1),
    }
    shutil.rmtree(mirror, ignore_errors=True)
    return result


#: Columns of a run copied from the night-0 run of its key (what record_run wrote for it).
_RUN_COLUMNS = [c.name for c in TuningRun.__table__.columns if c.name not in ("id", "created_at")]


def _record_night_in_bulk(session, templates: list[TuningRun], modules: list[list[bytes]], now: dt.datetime) -> list[str]:
    """The rows ``record_run`` and ``store_blob`` write for one night's runs, inserted a table
    at a time: each key's run a copy of its night-0 run (recorded by ``record_run``) but its
    ``created_at`` and JIT modules; its blobs and chunks as ``store_blob`` cuts them; each
    run made current (its key and environment's pointer moved, the generation too)."""
    blob_rows, chunk_rows, shas = [], [], []
    for data in (m for per_run in modules for m in per_run):
        sha = hashlib.sha256(data).hexdigest()
        shas.append(sha)
        blob_rows.append({"sha256": sha, "size_bytes": len(data), "created_at": now})
        chunk_rows += [{"sha256": sha, "seq": seq, "data": data[at:at + blobs.CHUNK_BYTES]}
                       for seq, at in enumerate(range(0, len(data), blobs.CHUNK_BYTES))]
    session.execute(insert(ArtifactBlob), blob_rows)
    session.execute(insert(ArtifactChunk), chunk_rows)
    table = TuningRun.__table__
    run_ids = [session.execute(insert(table).values(**{c: getattr(t, c) for c in _RUN_COLUMNS}, created_at=now)
                               .returning(table.c.id)).scalar_one() for t in templates]
    artifact_rows = []
    sha_iter = iter(shas)
    for template, run_id, per_run in zip(templates, run_ids, modules):
        autotune = template.artifacts[0]
        artifact_rows.append({"run_id": run_id, "kind": autotune.kind, "name": autotune.name,
                              "media_type": autotune.media_type, "sha256": autotune.sha256, "size_bytes": autotune.size_bytes})
        for m, data in enumerate(per_run):
            artifact_rows.append({"run_id": run_id, "kind": "flashinfer_jit_module", "name": f"module-{m}.tar.gz",
                                  "media_type": "application/gzip", "sha256": next(sha_iter), "size_bytes": len(data)})
    session.execute(insert(RunArtifact), artifact_rows)
    for template, run_id in zip(templates, run_ids):
        session.execute(update(CurrentTuning).where(CurrentTuning.key_id == template.key_id,
                                                    CurrentTuning.environment_id == template.environment_id)
                        .values(run_id=run_id, updated_at=now))
    session.execute(update(TuningGeneration).values(value=TuningGeneration.value + 1))
    return shas


def _vacuum(engine) -> None:
    """A plain ``VACUUM`` (not ``FULL``: nothing is given back to the file system) of the
    tables a night changes: what autovacuum does in the day between two nights, which here
    pass in about a second (autovacuum wakes once a minute)."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        for table in ("artifact_chunks", "artifact_blobs", "run_artifacts", "tuning_runs", "current_tunings"):
            connection.exec_driver_sql(f"VACUUM {table}")


def _database_size(engine) -> dict:
    if engine.dialect.name == "sqlite":
        with engine.connect() as connection:
            connection.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
            page_size = connection.exec_driver_sql("PRAGMA page_size").scalar()
            pages = connection.exec_driver_sql("PRAGMA page_count").scalar()
            free = connection.exec_driver_sql("PRAGMA freelist_count").scalar()
        path = Path(engine.url.database)
        wal = path.with_name(path.name + "-wal")
        return {"db_bytes": path.stat().st_size + (wal.stat().st_size if wal.exists() else 0),
                "db_bytes_in_use": (pages - free) * page_size}
    with engine.connect() as connection:
        schema = connection.execute(text("SELECT current_schema()")).scalar()
        total = connection.execute(text(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = :schema AND c.relkind = 'r'"),
            {"schema": schema}).scalar()
    return {"db_bytes": int(total), "db_bytes_in_use": None}


def _postgres_schema(base: str, label: str) -> tuple[str, str]:
    schema = f"tunecache_bench_retention_{label}_{uuid.uuid4().hex[:8]}"
    admin = create_engine(base)
    with admin.begin() as connection:
        connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    admin.dispose()
    sep = "&" if "?" in base else "?"
    return schema, f"{base}{sep}options=-csearch_path%3D{schema}"


def _drop_schema(base: str, schema: str) -> None:
    admin = create_engine(base)
    with admin.begin() as connection:
        connection.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
    admin.dispose()


def _mb(value: int | None) -> str:
    return "-" if value is None else f"{value / 1e6:,.1f} MB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nights", type=int, default=365)
    parser.add_argument("--keys", type=int, default=50, help="keys re-tuned every night")
    parser.add_argument("--modules", type=int, default=1, help="JIT modules per run")
    parser.add_argument("--module-bytes", type=int, default=16 * 1024, help="bytes of each JIT module (new every run)")
    parser.add_argument("--keep", type=int, default=10, help="runs kept per key with the policy on")
    parser.add_argument("--mirror-max-bytes", type=int, default=4 * 1024 * 1024, help="the mirror's cap with the policy on")
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES)
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--seed", type=int, default=20261202)
    parser.add_argument("--exact", action="store_true",
                        help="record every run with record_run and store_blob (about 20 ms a run here), not in bulk")
    parser.add_argument("--no-vacuum", action="store_true", help="on PostgreSQL, no VACUUM after each night")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    artifact_files.IN_USE_S = 0.0  # see the module's docstring
    policy = RetentionPolicy(keep=args.keep, grace=dt.timedelta(hours=1), mirror_max_bytes=args.mirror_max_bytes)
    print(f"{args.nights} nights x {args.keys} keys = {args.nights * args.keys:,} runs per store; each run: the "
          f"{len(AUTOTUNE_FILE.read_bytes()):,} B autotune file (the same every night) and {args.modules} JIT module(s) "
          f"of {args.module_bytes:,} B (new bytes every run); nproc {os.cpu_count()}", flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="tunecache-bench-retention-") as tmp:
        workdir = Path(tmp)
        for label, on in (("off", None), ("on", policy)):
            results.append(simulate("sqlite", f"sqlite:///{workdir / f'{label}.db'}", on, args, workdir))
            (workdir / f"{label}.db").unlink()
        if not args.no_postgres:
            for label, on in (("off", None), ("on", policy)):
                schema, url = _postgres_schema(args.postgres_url, label)
                try:
                    results.append(simulate("postgresql", url, on, args, workdir))
                finally:
                    _drop_schema(args.postgres_url, schema)
    header = f"{'database':<11} {'policy':<44} {'runs':>7} {'blobs':>7} {'blob bytes':>12} {'db on disk':>12} " \
             f"{'db in use':>12} {'mirror':>12} {'deleted runs/blobs/files':>25} {'s':>6} {'pass s':>7}"
    print(header)
    for r in results:
        deleted = f"{r['deleted']['runs']}/{r['deleted']['blobs']}/{r['deleted']['mirror_files']}"
        print(f"{r['database']:<11} {r['policy']:<44} {r['runs']:>7,} {r['blobs']:>7,} {_mb(r['blob_bytes']):>12} "
              f"{_mb(r['db_bytes']):>12} {_mb(r['db_bytes_in_use']):>12} {_mb(r['mirror_bytes']):>12} {deleted:>25} "
              f"{r['seconds']:>6.0f} {r['pass_seconds']:>7.1f}")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                                         "results": results}, indent=2))


if __name__ == "__main__":
    main()
