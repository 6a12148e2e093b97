"""Builders for test payloads from the real H200 FlashInfer files, and for what a test puts
in the database or the in-process app first (tokens, uploaded runs)."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

from sqlalchemy import Engine, select, text

from tunecache.contract import ArtifactKind, EnvironmentMetadata, TuningKey
from tunecache.formats.autotune_file import parse_autotune_file
from tunecache.service import db
from tunecache.service.models import PodReport

from tests.support.paths import CUDNN_FILE


def h200_key(**overrides) -> TuningKey:
    fields = dict(gpu_name="NVIDIA H200", arch="sm90", model="meta-llama/Llama-3.1-8B", max_num_batched_tokens=8192)
    fields.update(overrides)
    return TuningKey(**fields)


def file_environment(path: Path) -> EnvironmentMetadata:
    return parse_autotune_file(path.read_bytes()).environment


def run_payload(path: Path, key: TuningKey | None = None, **overrides) -> dict:
    """JSON body of POST /v1/tunings for one FlashInfer file (its bytes must be uploaded)."""
    data = path.read_bytes()
    parsed = parse_autotune_file(data)
    body = {
        "key": (key or h200_key()).model_dump(),
        "environment": parsed.environment.model_dump(),
        "trigger": "upload",
        "summary": {"entries": parsed.entries},
        "artifacts": [
            {"kind": ArtifactKind.FLASHINFER_AUTOTUNE.value, "name": "autotune.json", "media_type": "application/json",
             "sha256": hashlib.sha256(data).hexdigest()}
        ],
    }
    body.update(overrides)
    return body


def pod_jit_environment(env: dict[str, str]) -> dict | None:
    """``jit_environment()`` as a pod process with ``env`` sees it (``None``: FlashInfer
    finds no CUDA toolkit there)."""
    import json
    import subprocess
    import sys

    here = subprocess.run([sys.executable, "-c", "import json; from tunecache.formats.jit_module import jit_environment; "
                           "print(json.dumps(jit_environment()))"], env=env, capture_output=True, text=True, check=True)
    return json.loads(here.stdout)


def signed(payload: dict, signing_key) -> dict:
    """``payload`` (a POST /v1/tunings body) with the signature of ``signing_key``, as a
    tuner node with ``TUNECACHE_SIGNING_KEY`` sends it."""
    from tunecache.contract import TuningRunCreate
    from tunecache.signing import sign_run

    run = TuningRunCreate.model_validate(payload)
    return {**payload, "signature": sign_run(signing_key, run.key, run.environment, run.artifacts, run.summary).model_dump()}


def store_file(session, path: Path) -> str:
    """Store a file's bytes through the repository; returns its sha256."""
    from tunecache.service import blobs

    data = path.read_bytes()
    with path.open("rb") as stream:
        return blobs.store_blob(session, stream, hashlib.sha256(data).hexdigest()).sha256


def stored_reports(database_url: str, expected: int, timeout: float = 15.0) -> list[PodReport]:
    """The reports in the database, oldest first, once there are ``expected`` of them (pods
    send them in the background, the service stores them in batches); fails after
    ``timeout`` seconds."""
    engine = db.create_db_engine(database_url)
    try:
        give_up = time.monotonic() + timeout
        while True:
            with db.session_factory(engine)() as session:
                rows = list(session.scalars(select(PodReport).order_by(PodReport.id)))
            if len(rows) >= expected or time.monotonic() > give_up:
                assert len(rows) == expected, [(r.outcome, r.source, r.rank) for r in rows]
                return rows
            time.sleep(0.1)
    finally:
        engine.dispose()


def plan_of(connection, statement) -> list[str]:
    """The database's plan of ``statement`` (its parameters bound, as the service runs it), one step a line."""
    compiled = statement.compile(dialect=connection.dialect)
    params = compiled.construct_params()
    if connection.dialect.name == "sqlite":
        rows = connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {compiled.string}",
                                          tuple(params[name] for name in compiled.positiontup))
        return [str(row[-1]).strip() for row in rows]
    connection.execute(text("SET LOCAL enable_seqscan = off"))  # tiny tables are read whole otherwise
    return [row[0].strip() for row in connection.exec_driver_sql(f"EXPLAIN {compiled.string}", params)]


def make_token(engine: Engine, name: str, scope: str) -> str:
    """A new token of ``scope`` on the database, created as ``tunecache token create`` would."""
    from tunecache.contract import Scope
    from tunecache.service import tokens

    with db.session_factory(engine).begin() as session:
        return tokens.create_token(session, name, Scope(scope)).token


def lookup_body(path: Path = CUDNN_FILE, **key_fields) -> dict:
    """JSON body of POST /v1/tunings/lookup for the H200 key and ``path``'s environment."""
    return {"key": h200_key(**key_fields).model_dump(), "environment": run_payload(path)["environment"]}


def upload(client, path):
    """PUT a file's bytes through a TestClient (the in-process app); returns its sha256."""
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    response = client.put(f"/v1/artifacts/{digest}", content=data)
    assert response.status_code in (200, 201), response.text
    return digest


def record(client, path=CUDNN_FILE, **overrides):
    """Upload ``path`` and record it as a run through a TestClient; returns the run."""
    upload(client, path)
    response = client.post("/v1/tunings", json=run_payload(path, **overrides))
    assert response.status_code == 201, response.text
    return response.json()
