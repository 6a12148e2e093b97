"""Fleet view, history and diff queries on PostgreSQL with a fleet's worth of data: p50/p95.

    .venv/bin/python bench/fleet_queries.py [--database-url URL] [--reseed] [--repeat 200]
                                            [--warmup 20] [--hours 24] [--no-http]
                                            [--wait-idle] [--json PATH]

The database (default ``postgresql+psycopg://postgres@127.0.0.1:5432/tunecache_bench``) is
created when missing and brought to the head revision with the project's migrations
(:func:`tunecache.service.db.upgrade`, what ``tunecache db upgrade`` runs). An empty one is
seeded (``--reseed``: dropped and seeded again) with, by default:

* 1,000 tuning keys over 5 GPUs (4 architectures), 50 models, 4 ``max_num_batched_tokens``
  and 4 tensor-parallel sizes; 3 FlashInfer environments per GPU (0.6.13, 0.7.4, 0.7.4 on an
  older cuDNN);
* 10,000 runs (10 per key) over 60 days, ids in time order: about 88 % succeeded, the rest
  failed; triggers upload / cli / http / pod (pod runs unverified); the newest succeeded,
  verified run of each key and environment current, as ``publishing.record_run`` leaves it;
  every succeeded run with a ``flashinfer_autotune_v1`` artifact: one of 8 variants per
  environment of the real FlashInfer files in ``tests/fixtures`` (a few entries with another
  tactic and time, some with one entry less), stored with :func:`tunecache.service.blobs.store_blob`;
* 100,000 pod reports over the 7 days of retention from 2,000 pods: each pod runs one key in
  one environment; most install the current run (a few fail: ``error``), some run an
  environment no run was tuned in, or a key never tuned (``miss``, with the closest run and
  its differences as a lookup's 404 names them).

Then each query runs ``--warmup`` times untimed and ``--repeat`` times timed, end to end as
its route runs it, JSON body included:

* ``direct``: the route's own code in this process on a pooled engine: ``GET /v1/fleet`` =
  :func:`tunecache.service.reports.fleet_view` in a transaction and ``model_dump_json``;
  ``GET /v1/tunings`` and ``GET /v1/tunings/{a}/diff/{b}`` = the route functions of
  :mod:`tunecache.service.routes.tunings` themselves (``list_tunings``, ``diff_tunings``);
  after the setup the process freezes its objects out of the garbage collector's passes
  (``gc.freeze()``), as the service does after its startup;
* ``http``: the same requests to a live ``tunecache serve`` (one process, no job worker) on
  the database, over HTTP/1.1 keep-alive with httpx: routing, validation, FastAPI's
  serialization and the socket included.

The fleet view is paged (:data:`FLEET_PAGES`): its first page (100 keys, 100 wanted), a
deep one (keys from offset 900, the second page of the wanted list) and, for scale, one page
of 1,000 keys (the whole matrix at once, as ``GET /v1/fleet`` answered before it was paged).
Every page counts and orders every key of the window; only the page's rows are built.

The fleet view keeps the current tunings it read until the tuning generation moves
(:func:`tunecache.service.reports.current_tunings`); ``fleet ... cold`` moves the generation
before each call (untimed, as recording a tuning does, changing nothing else), so every
call reads them again: the first view after a tuning became current (first page).

Prints the data sizes, the machine (nproc, CPU, PostgreSQL version, load average, whether a
pytest run was going on, a CPU probe: this machine is shared and its speed varies) and a
table of n, p50, p95, max (milliseconds; nearest-rank percentiles) and the answer's size per
query; ``--json PATH`` writes the same as JSON. A figure here is a measurement of this
machine, not a test: nothing is asserted but that every answer is a 200.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import hashlib
import io
import json
import math
import os
import platform
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import httpx
from sqlalchemy import create_engine, func, insert, select, text, update
from sqlalchemy.engine import Engine, make_url

from tunecache.contract import (
    NOT_TRACKED,
    ArtifactKind,
    EnvironmentMetadata,
    ReportOutcome,
    ReportSource,
    RunStatus,
    RunTrigger,
    TuningKey,
    TuningRunQuery,
    differences,
)
from tunecache.service import blobs, db, reports
from tunecache.service.models import (
    CurrentTuning,
    Environment,
    PodReport,
    RunArtifact,
    TuningGeneration,
    TuningKeyRow,
    TuningRun,
)
from tunecache.service.routes import tunings as tuning_routes

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/tunecache_bench"

#: (gpu_name as torch names it, arch, share of keys)
GPUS = (("NVIDIA H100 80GB HBM3", "sm90", 0.30), ("NVIDIA H200", "sm90", 0.30), ("NVIDIA B200", "sm100", 0.15),
        ("NVIDIA A100-SXM4-80GB", "sm80", 0.15), ("NVIDIA L40S", "sm89", 0.10))
MODELS = (
    "meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-70B-Instruct", "meta-llama/Llama-3.1-405B-Instruct-FP8",
    "meta-llama/Llama-3.2-1B-Instruct", "meta-llama/Llama-3.2-3B-Instruct", "meta-llama/Llama-3.3-70B-Instruct",
    "meta-llama/Llama-4-Scout-17B-16E-Instruct", "meta-llama/Llama-4-Maverick-17B-128E-Instruct-FP8",
    "Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B", "Qwen/Qwen3-4B", "Qwen/Qwen3-8B", "Qwen/Qwen3-14B", "Qwen/Qwen3-32B",
    "Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-235B-A22B", "Qwen/Qwen3-Coder-30B-A3B-Instruct", "Qwen/Qwen2.5-7B-Instruct",
    "Qwen/Qwen2.5-14B-Instruct", "Qwen/Qwen2.5-32B-Instruct", "Qwen/Qwen2.5-72B-Instruct",
    "Qwen/Qwen2.5-Coder-32B-Instruct", "Qwen/Qwen2.5-VL-7B-Instruct", "deepseek-ai/DeepSeek-V3",
    "deepseek-ai/DeepSeek-R1", "deepseek-ai/DeepSeek-R1-Distill-Llama-8B", "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B",
    "deepseek-ai/DeepSeek-Coder-V2-Lite-Instruct", "mistralai/Mistral-7B-Instruct-v0.3",
    "mistralai/Mistral-Nemo-Instruct-2407", "mistralai/Mistral-Small-3.1-24B-Instruct-2503",
    "mistralai/Mixtral-8x7B-Instruct-v0.1", "mistralai/Mixtral-8x22B-Instruct-v0.1",
    "mistralai/Ministral-8B-Instruct-2410", "google/gemma-2-9b-it", "google/gemma-2-27b-it", "google/gemma-3-4b-it",
    "google/gemma-3-12b-it", "google/gemma-3-27b-it", "microsoft/phi-4", "microsoft/Phi-3.5-mini-instruct",
    "microsoft/Phi-3.5-MoE-instruct", "ibm-granite/granite-3.3-8b-instruct", "nvidia/Llama-3.1-Nemotron-70B-Instruct-HF",
    "nvidia/Llama-3_3-Nemotron-Super-49B-v1", "openai/gpt-oss-20b", "openai/gpt-oss-120b", "01-ai/Yi-1.5-34B-Chat",
    "tiiuae/falcon-40b-instruct", "allenai/OLMo-2-1124-13B-Instruct",
)
#: The mixture-of-experts models above (some of their keys run expert-parallel).
MOE_MODELS = frozenset(m for m in MODELS if any(tag in m for tag in (
    "-A3B", "-A22B", "Mixtral", "DeepSeek-V3", "DeepSeek-R1", "-16E-", "-128E-", "gpt-oss", "MoE")) and "Distill" not in m)
MAX_NUM_BATCHED_TOKENS = (2048, 4096, 8192, 16384)
TENSOR_PARALLEL_SIZES = (1, 2, 4, 8)
#: Environments of each GPU: (name, fixture file, overrides of its ``_metadata``). Runs are
#: tuned in the first three; ``rollout`` (a newer cuDNN) only appears in pods' misses.
ENVIRONMENTS = (
    ("fi0613", FIXTURES / "flashinfer-0.6.13-h200" / "llama-3.1-8b-mm_bf16-cudnn.json", {}),
    ("fi074", FIXTURES / "flashinfer-0.7.4-h200" / "mm_bf16-cudnn.json", {}),
    ("fi074-cudnn917", FIXTURES / "flashinfer-0.7.4-h200" / "mm_bf16-cublaslt.json", {"cudnn_version": "91700"}),
    ("rollout", FIXTURES / "flashinfer-0.7.4-h200" / "mm_bf16-cudnn.json", {"cudnn_version": "92000"}),
)
TUNED_ENVIRONMENTS = ("fi0613", "fi074", "fi074-cudnn917")
#: Variants of each environment's FlashInfer file stored as blobs (runs share them).
VARIANTS = 8
RUN_DAYS = 60
RETENTION_DAYS = 7
ERROR_KINDS = ("UntrustedRun", "ArtifactCorrupt", "OSError", "TimeoutError")
RUN_ERRORS = ("tuner child exited with code -9 (killed: out of memory)", "CUDA error: out of memory",
              "tuner child timed out after 3600 s", "RuntimeError: cuDNN engine config failed")
BATCH = 5000
#: The fleet pages timed: (name, ``GET /v1/fleet`` paging parameters).
FLEET_PAGES = (
    ("first page", {"limit": 100, "offset": 0, "wanted_limit": 100, "wanted_offset": 0}),
    ("deep page (offset 900, wanted 100)", {"limit": 100, "offset": 900, "wanted_limit": 100, "wanted_offset": 100}),
    ("limit=1000 (whole matrix)", {"limit": 1000, "offset": 0, "wanted_limit": 1000, "wanted_offset": 0}),
)
#: The summary a tuner node records (``tunecache.service.tuner``: entries, seconds, stages,
#: JIT modules, JIT workspace), as in results/gpu/2026-11-30-qwen3-30b-a3b-jobs/tune.json;
#: uploaded files have ``{"entries": N}`` only.
TUNER_SUMMARY = {
    "entries": 0, "tuning_seconds": 0.0,
    "stages": {
        "deep_gemm": {"status": "skipped", "reason": "DeepGEMM warmup applies to fp8 (block-scaled) checkpoints only"},
        "gemm": {"status": "done", "seconds": 125.831, "op": "mm_bf16", "max_m": 8192, "calls": [
            {"shape": "qkv", "n": 5120, "k": 2048, "backend": "cudnn", "seconds": 60.585},
            {"shape": "qkv", "n": 5120, "k": 2048, "backend": "cublaslt", "seconds": 8.788},
            {"shape": "o", "n": 2048, "k": 4096, "backend": "cudnn", "seconds": 55.473},
            {"shape": "o", "n": 2048, "k": 4096, "backend": "cublaslt", "seconds": 0.985}]},
        "moe": {"status": "skipped", "reason": "not requested"},
        "attention": {"status": "done", "seconds": 97.157, "page_size": 16, "num_qo_heads": 32, "num_kv_heads": 4,
                      "head_dim": 128, "decode_tensor_cores": True}},
    "jit_modules": [
        "batch_prefill_with_kv_cache_dtype_q_bf16_dtype_kv_bf16_dtype_o_bf16_dtype_idx_i32_head_dim_qk_128_head_dim_vo_128_"
        "posenc_0_use_swa_False_use_logits_cap_False_f16qk_False_kv_stride_equal",
        "batch_prefill_with_kv_cache_dtype_q_bf16_dtype_kv_bf16_dtype_o_bf16_dtype_idx_i32_head_dim_qk_128_head_dim_vo_128_"
        "posenc_0_use_swa_False_use_logits_cap_False_f16qk_False_sm90",
        "mm_bf16_cublaslt", "trtllm_utils"],
    "flashinfer_jit": {"workspace_base": "/var/lib/tunecache/fi", "workspace_subdir": "0.7.4/90a"},
}


@dataclass
class Sizes:
    """How much data to seed: keys tuned (each with ``runs_per_key`` runs), keys only pods
    ask for, pod reports over ``RETENTION_DAYS``, and distinct pods."""

    keys: int = 1000
    runs_per_key: int = 10
    untuned_keys: int = 100
    reports: int = 100_000
    pods: int = 2000


# ------------------------------------------------------------------------------ database


def ensure_database(url: str, reseed: bool) -> None:
    """Create the database of ``url`` when it does not exist (``--reseed``: drop it first),
    from the server's ``postgres`` database with AUTOCOMMIT."""
    parsed = make_url(db.normalize_url(url))
    name = parsed.database
    admin = create_engine(parsed.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            if reseed:
                connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            exists = connection.scalar(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name})
            if not exists:
                connection.execute(text(f'CREATE DATABASE "{name}"'))
                print(f"created database {name}", file=sys.stderr)
    finally:
        admin.dispose()


def vacuum_analyze(url: str) -> None:
    """``VACUUM ANALYZE`` (statistics and visibility map after a bulk load, as autovacuum
    would leave a database in service)."""
    engine = create_engine(db.normalize_url(url), isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            connection.execute(text("VACUUM ANALYZE"))
    finally:
        engine.dispose()


# ------------------------------------------------------------------------------ seeding


def _environment(name: str, fixture: Path, overrides: dict[str, str], gpu_name: str) -> tuple[EnvironmentMetadata, dict]:
    """The environment named ``name`` on ``gpu_name`` and the fixture's document with that
    ``_metadata`` (a field FlashInfer did not track stays absent, as FlashInfer writes it)."""
    document = json.loads(fixture.read_bytes())
    metadata = {**document["_metadata"], **overrides, "gpu": gpu_name}
    environment = EnvironmentMetadata.from_flashinfer_metadata(metadata)
    document["_metadata"] = {f: v for f, v in environment.model_dump().items() if v != NOT_TRACKED}
    return environment, document


def _shift_tactic(tactic, delta: int):
    """``tactic`` with its first integer moved by ``delta`` (another tactic of the same shape)."""
    if isinstance(tactic, bool):
        return tactic
    if isinstance(tactic, int):
        return max(0, tactic + delta) if tactic + delta >= 0 else tactic + abs(delta)
    if isinstance(tactic, list):
        for i, part in enumerate(tactic):
            shifted = _shift_tactic(part, delta)
            if shifted != part:
                return [*tactic[:i], shifted, *tactic[i + 1:]]
    return tactic


def variant_file(document: dict, variant: int, rng: random.Random) -> bytes:
    """Variant ``variant`` of a FlashInfer file: 0 is the file; others have 2-5 entries with
    another tactic (and, where the file records selections, a time 5 % faster to 12 % slower),
    and every fourth one entry less."""
    doc = json.loads(json.dumps(document))
    if variant:
        entries = [k for k in doc if not k.startswith("_")]
        for file_key in rng.sample(entries, rng.randint(2, 5)):
            value = doc[file_key]
            value[1] = _shift_tactic(value[1], rng.randint(1, 3))
            if len(value) > 3 and isinstance(value[3], dict) and "time_ms" in value[3]:
                value[3]["time_ms"] = round(value[3]["time_ms"] * rng.uniform(0.95, 1.12), 6)
        if variant % 4 == 0:
            del doc[rng.choice(entries)]
    return json.dumps(doc, indent=2).encode()


def _weighted(rng: random.Random, items, weights):
    return rng.choices(items, weights=weights, k=1)[0]


def _make_keys(rng: random.Random, count: int, taken: set[TuningKey]) -> list[TuningKey]:
    """``count`` distinct keys not in ``taken``: models by a Zipf-like popularity, GPUs by share."""
    model_weights = [1 / (i + 1) ** 0.8 for i in range(len(MODELS))]
    keys: list[TuningKey] = []
    while len(keys) < count:
        gpu_name, arch, _ = _weighted(rng, GPUS, [g[2] for g in GPUS])
        tp = _weighted(rng, TENSOR_PARALLEL_SIZES, (0.4, 0.25, 0.2, 0.15))
        model = _weighted(rng, MODELS, model_weights)
        expert_parallel = model in MOE_MODELS and tp > 1 and rng.random() < 0.5
        key = TuningKey(
            gpu_name=gpu_name, arch=arch, model=model,
            max_num_batched_tokens=rng.choice(MAX_NUM_BATCHED_TOKENS),
            dtype="auto" if rng.random() < 0.85 else "bfloat16",
            quantization="auto" if rng.random() < 0.8 else "fp8",
            tensor_parallel_size=tp, expert_parallel_size=tp if expert_parallel else 1)
        if key not in taken:
            taken.add(key)
            keys.append(key)
    return keys


def seed(url: str, sizes: Sizes, rng_seed: int) -> None:
    """Fill the (empty, migrated) database of ``url``: keys, environments, blobs, runs with
    their artifacts and current tunings, then pod reports in batches of :data:`BATCH`."""
    rng = random.Random(rng_seed)
    now = dt.datetime.now(dt.timezone.utc)
    engine = db.create_db_engine(url, statement_timeout_s=600)
    sessions = db.session_factory(engine)
    started = time.monotonic()
    try:
        taken: set[TuningKey] = set()
        tuned = _make_keys(rng, sizes.keys, taken)
        untuned = _make_keys(rng, sizes.untuned_keys, taken)

        # environments and the variants of their files (blobs), per GPU
        environments: dict[tuple[str, str], EnvironmentMetadata] = {}
        environment_ids: dict[tuple[str, str], int] = {}
        variants: dict[tuple[str, str], list[tuple[str, int, int]]] = {}  # (sha256, size, entries)
        with sessions.begin() as session:
            for gpu_name, _arch, _ in GPUS:
                for name, fixture, overrides in ENVIRONMENTS:
                    environment, document = _environment(name, fixture, overrides, gpu_name)
                    environments[gpu_name, name] = environment
                    if name not in TUNED_ENVIRONMENTS:
                        continue
                    environment_ids[gpu_name, name] = session.scalar(insert(Environment).returning(Environment.id), {
                        "env_hash": environment.environment_hash(), "created_at": now - dt.timedelta(days=RUN_DAYS + 1),
                        **environment.model_dump()})
                    stored = []
                    for variant in range(VARIANTS):
                        data = variant_file(document, variant, rng)
                        blob = blobs.store_blob(session, io.BytesIO(data), hashlib.sha256(data).hexdigest())
                        stored.append((blob.sha256, blob.size_bytes, sum(1 for k in json.loads(data) if not k.startswith("_"))))
                    variants[gpu_name, name] = stored

            key_ids = session.scalars(insert(TuningKeyRow).returning(TuningKeyRow.id, sort_by_parameter_order=True), [
                {**key.model_dump(), "created_at": now - dt.timedelta(days=RUN_DAYS + 1)} for key in tuned]).all()

        # runs, oldest first so that ids follow time as they do in service
        planned = []
        for key, key_id in zip(tuned, key_ids):
            for offset in sorted(rng.uniform(600, RUN_DAYS * 86400) for _ in range(sizes.runs_per_key)):
                created_at = now - dt.timedelta(seconds=offset)
                if offset > 35 * 86400:
                    env_name = "fi0613" if rng.random() < 0.8 else "fi074"
                else:
                    env_name = "fi074" if rng.random() < 0.7 else "fi074-cudnn917"
                planned.append((created_at, key, key_id, env_name))
        planned.sort(key=lambda p: p[0])
        run_rows, artifacts_of = [], []
        for created_at, key, key_id, env_name in planned:
            succeeded = rng.random() < 0.88
            trigger = (_weighted(rng, (RunTrigger.UPLOAD, RunTrigger.CLI, RunTrigger.HTTP, RunTrigger.POD), (25, 35, 30, 10))
                       if succeeded else rng.choice((RunTrigger.CLI, RunTrigger.HTTP)))
            duration = rng.uniform(240, 2400)
            sha256, size, entries = rng.choice(variants[key.gpu_name, env_name]) if succeeded else (None, 0, 0)
            run_rows.append({
                "key_id": key_id, "environment_id": environment_ids[key.gpu_name, env_name],
                "status": (RunStatus.SUCCEEDED if succeeded else RunStatus.FAILED).value, "trigger": trigger.value,
                "node": None if trigger is RunTrigger.UPLOAD else f"gpu-node-{rng.randint(1, 40):02d}",
                "started_at": created_at - dt.timedelta(seconds=duration), "finished_at": created_at,
                "duration_s": duration, "error": None if succeeded else rng.choice(RUN_ERRORS),
                "summary": ({} if not succeeded else {"entries": entries} if trigger is RunTrigger.UPLOAD
                            else {**TUNER_SUMMARY, "entries": entries, "tuning_seconds": round(duration, 3)}),
                "verified": trigger is not RunTrigger.POD,
                "created_at": created_at, "signing_key_id": None, "signature": None,
                "recorded_by": {"upload": "ci-upload", "cli": "tuner-node", "http": "tuner-node", "pod": "pods"}[trigger.value],
            })
            artifacts_of.append((sha256, size))
        with sessions.begin() as session:
            run_ids = []
            for start in range(0, len(run_rows), BATCH):
                run_ids += session.scalars(insert(TuningRun).returning(TuningRun.id, sort_by_parameter_order=True),
                                           run_rows[start:start + BATCH]).all()
            artifact_rows = [{"run_id": run_id, "kind": ArtifactKind.FLASHINFER_AUTOTUNE.value, "name": "autotune.json",
                              "media_type": ArtifactKind.FLASHINFER_AUTOTUNE.media_type, "sha256": sha256, "size_bytes": size}
                             for run_id, (sha256, size) in zip(run_ids, artifacts_of) if sha256 is not None]
            for start in range(0, len(artifact_rows), BATCH):
                session.execute(insert(RunArtifact), artifact_rows[start:start + BATCH])
            # current: the newest (highest id) succeeded, verified run of each key and environment
            current: dict[tuple[int, int], tuple[int, dt.datetime]] = {}
            for run_id, row in zip(run_ids, run_rows):
                if row["status"] == RunStatus.SUCCEEDED.value and row["verified"]:
                    current[row["key_id"], row["environment_id"]] = (run_id, row["created_at"])
            session.execute(insert(CurrentTuning), [
                {"key_id": k, "environment_id": e, "run_id": r, "updated_at": at} for (k, e), (r, at) in current.items()])
            session.execute(update(TuningGeneration).where(TuningGeneration.id == 1).values(value=TuningGeneration.value + 1))
        print(f"seeded {len(run_rows)} runs, {len(current)} current tunings in {time.monotonic() - started:.0f} s",
              file=sys.stderr)

        # pods: each runs one key in one environment
        env_name_of_id = {v: k[1] for k, v in environment_ids.items()}
        current_of_key: dict[TuningKey, list[tuple[str, int]]] = defaultdict(list)  # (env name, run id)
        current_of_model: dict[str, list[tuple[TuningKey, str, int]]] = defaultdict(list)
        key_by_id = dict(zip(key_ids, tuned))
        for (key_id, environment_id), (run_id, _) in current.items():
            key = key_by_id[key_id]
            current_of_key[key].append((env_name_of_id[environment_id], run_id))
            current_of_model[key.model].append((key, env_name_of_id[environment_id], run_id))
        tuned_with_current = [k for k in tuned if current_of_key[k]]
        popularity = [rng.paretovariate(1.2) for _ in tuned_with_current]
        pods = []
        for number in range(sizes.pods):
            r = rng.random()
            if r < 0.86:  # a tuned key in an environment it has a current tuning for
                key = _weighted(rng, tuned_with_current, popularity)
                envs = sorted(current_of_key[key], key=lambda e: TUNED_ENVIRONMENTS.index(e[0]))
                env_name, run_id = envs[-1] if rng.random() < 0.8 else rng.choice(envs)
                closest = None
            else:  # a newer cuDNN nothing was tuned in, or a key never tuned
                key = _weighted(rng, tuned_with_current, popularity) if r < 0.93 else rng.choice(untuned)
                env_name, run_id = ("rollout", None) if r < 0.93 else ("fi074", None)
                same_model = current_of_model.get(key.model) or []
                closest = min(same_model, key=lambda c: (len(differences(c[0], environments[c[0].gpu_name, c[1]], key,
                                                                          environments[key.gpu_name, env_name])), -c[2]),
                              default=None)
            short = key.model.split("/")[-1].lower().replace(".", "-")[:28]
            gpu_tag = key.gpu_name.split()[1].split("-")[0].lower()
            pods.append(SimpleNamespace(
                name=f"vllm-{short}-{gpu_tag}-tp{key.tensor_parallel_size}-{number:04d}-{rng.randrange(36 ** 5):05x}",
                key=key, key_hash=key.key_hash(), environment=environments[key.gpu_name, env_name], run_id=run_id,
                closest=closest, weight=rng.uniform(0.5, 2.0)))
        for pod in pods:
            pod.environment_hash = pod.environment.environment_hash()
            if pod.closest is not None:
                stored_key, stored_env, stored_run = pod.closest
                pod.differences = [d.model_dump() for d in differences(
                    stored_key, environments[stored_key.gpu_name, stored_env], pod.key, pod.environment)]

        rows = []
        weights = [p.weight for p in pods]
        for _ in range(sizes.reports):
            pod = _weighted(rng, pods, weights)
            received_at = now - dt.timedelta(seconds=rng.uniform(0, RETENTION_DAYS * 86400 - 600))
            source = _weighted(rng, (ReportSource.PLUGIN, ReportSource.CLI, ReportSource.API), (70, 20, 10))
            rank = rng.randrange(pod.key.tensor_parallel_size) if source is ReportSource.PLUGIN else None
            row = {**pod.key.model_dump(), "received_at": received_at, "key_hash": pod.key_hash,
                   "environment_hash": pod.environment_hash, "environment": None, "run_id": None, "differences": None,
                   "error_kind": None, "jit_modules": 0, "jit_skipped": 0, "pod": pod.name, "rank": rank,
                   "source": source.value, "looked_up": rank in (None, 0)}
            if pod.run_id is not None and rng.random() < 0.97:
                row.update(outcome=ReportOutcome.INSTALLED.value, run_id=pod.run_id,
                           install_seconds=round(rng.lognormvariate(0.3, 0.5), 3), jit_modules=rng.choice((0, 0, 4, 9, 12)))
            elif pod.run_id is not None:
                row.update(outcome=ReportOutcome.ERROR.value, error_kind=rng.choice(ERROR_KINDS),
                           install_seconds=round(rng.uniform(0.05, 8), 3))
            else:
                row.update(outcome=ReportOutcome.MISS.value, environment=pod.environment.model_dump(),
                           run_id=pod.closest[2] if pod.closest else None,
                           differences=pod.differences if pod.closest else None,
                           install_seconds=round(rng.uniform(0.02, 0.4), 3))
            rows.append(row)
        rows.sort(key=lambda r: r["received_at"])  # ids in time order, as received
        with engine.begin() as connection:
            for start in range(0, len(rows), BATCH):
                connection.execute(insert(PodReport.__table__), rows[start:start + BATCH])
        print(f"seeded {len(rows)} reports from {len(pods)} pods in {time.monotonic() - started:.0f} s", file=sys.stderr)
    finally:
        engine.dispose()


# ------------------------------------------------------------------------------ timing


@dataclass
class Timing:
    """The times of one query: ``times_s`` seconds each, ``size`` bytes of its (last) answer."""

    path: str
    query: str
    times_s: list[float] = field(default_factory=list)
    size: int = 0

    def percentile(self, p: float) -> float:
        """Nearest-rank percentile ``p`` (0-100) of the times, in milliseconds."""
        ordered = sorted(self.times_s)
        return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)] * 1000

    def summary(self) -> dict:
        """``{path, query, n, p50_ms, p95_ms, max_ms, bytes}``."""
        return {"path": self.path, "query": self.query, "n": len(self.times_s), "p50_ms": round(self.percentile(50), 2),
                "p95_ms": round(self.percentile(95), 2), "max_ms": round(max(self.times_s) * 1000, 2), "bytes": self.size}


def measure(path: str, query: str, call: Callable[[int], bytes], warmup: int, repeat: int,
            before: Callable[[], None] | None = None) -> Timing:
    """Run ``call(i)`` ``warmup`` times untimed, then ``repeat`` times timed (perf_counter);
    ``call`` returns the answer's body. ``before`` runs before each call, untimed."""
    for i in range(warmup):
        if before is not None:
            before()
        call(i)
    timing = Timing(path, query)
    for i in range(repeat):
        if before is not None:
            before()
        started = time.perf_counter()
        body = call(i)
        timing.times_s.append(time.perf_counter() - started)
        timing.size = len(body)
    print(f"  {path:6} {query:50} p50 {timing.percentile(50):8.2f} ms  p95 {timing.percentile(95):8.2f} ms",
          file=sys.stderr, flush=True)
    return timing


def move_generation(sessions) -> None:
    """Move the tuning generation, as recording a current tuning does, without changing any
    tuning: the next fleet view reads the current tunings again (its cold case; lookups'
    caches are dropped too)."""
    with sessions.begin() as session:
        session.execute(update(TuningGeneration).where(TuningGeneration.id == 1).values(value=TuningGeneration.value + 1))


class RouteRequest:
    """What the route functions read of their Starlette request: the service state's
    ``sessions`` and ``diff_slots`` (``app.state.tunecache``) and ``headers`` (none: JSON answers)."""

    def __init__(self, sessions):
        state = SimpleNamespace(sessions=sessions, diff_slots=threading.BoundedSemaphore(1))
        self.app = SimpleNamespace(state=SimpleNamespace(tunecache=state))
        self.headers: dict[str, str] = {}


@dataclass
class Workload:
    """The requests timed: history queries ``(name, query parameters)`` and run pairs to diff."""

    history: list[tuple[str, dict]]
    diff_pairs: list[tuple[int, int]]


def workload(sessions) -> Workload:
    """History filters over the seeded data (its most-run model, a GPU, FlashInfer 0.6.13,
    failed runs, the second page after a cursor) and 50 pairs of consecutive succeeded runs of
    one key and environment whose files differ."""
    with sessions.begin() as session:
        model = session.execute(select(TuningKeyRow.model, func.count()).join(TuningRun, TuningRun.key_id == TuningKeyRow.id)
                                .group_by(TuningKeyRow.model).order_by(func.count().desc()).limit(1)).one()[0]
        first = json.loads(tuning_routes.list_tunings(TuningRunQuery(), RouteRequest(sessions), None).body)
        rows = session.execute(
            select(TuningRun.id, TuningRun.key_id, TuningRun.environment_id, RunArtifact.sha256)
            .join(RunArtifact, RunArtifact.run_id == TuningRun.id)
            .where(TuningRun.status == RunStatus.SUCCEEDED.value, RunArtifact.kind == ArtifactKind.FLASHINFER_AUTOTUNE.value)
            .order_by(TuningRun.key_id, TuningRun.environment_id, TuningRun.id)).all()
    pairs = [(a.id, b.id) for a, b in zip(rows, rows[1:])
             if (a.key_id, a.environment_id) == (b.key_id, b.environment_id) and a.sha256 != b.sha256]
    random.Random(7).shuffle(pairs)
    history = [
        ("first page", {}),
        (f"model={model}", {"model": model}),
        ("gpu_name=NVIDIA H200", {"gpu_name": "NVIDIA H200"}),
        ("flashinfer_version=0.6.13", {"flashinfer_version": "0.6.13"}),
        ("status=failed", {"status": "failed"}),
        ("second page (cursor)", {"cursor": first["next_cursor"]}),
    ]
    return Workload(history=history, diff_pairs=pairs[:50])


def time_direct(sessions, load: Workload, hours: float, warmup: int, repeat: int) -> list[Timing]:
    """The routes' code in this process (see the module)."""
    request = RouteRequest(sessions)

    def fleet(page: dict) -> Callable[[int], bytes]:
        def call(_i: int) -> bytes:
            with sessions.begin() as session:
                view = reports.fleet_view(session, hours, **page)
            return view.model_dump_json().encode()
        return call

    def history(params: dict) -> Callable[[int], bytes]:
        query = TuningRunQuery(**params)
        return lambda _i: bytes(tuning_routes.list_tunings(query, request, None).body)

    def diff(i: int) -> bytes:
        run_a, run_b = load.diff_pairs[i % len(load.diff_pairs)]
        return tuning_routes.diff_tunings(run_a, run_b, request, None).model_dump_json().encode()

    timings = [measure("direct", f"fleet {name}", fleet(page), warmup, repeat) for name, page in FLEET_PAGES]
    timings.append(measure("direct", f"fleet {FLEET_PAGES[0][0]} cold", fleet(FLEET_PAGES[0][1]), warmup, repeat,
                           before=lambda: move_generation(sessions)))
    timings += [measure("direct", f"history {name}", history(params), warmup, repeat) for name, params in load.history]
    timings.append(measure("direct", f"diff ({len(load.diff_pairs)} run pairs)", diff, warmup, repeat))
    return timings


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def time_http(url: str, sessions, load: Workload, hours: float, warmup: int, repeat: int) -> list[Timing]:
    """The same requests to a live ``tunecache serve`` (one process, no job worker) on the database."""
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="tunecache-bench-") as data_dir:
        log = open(Path(data_dir) / "serve.log", "w")
        env = {**os.environ, "TUNECACHE_JOB_WORKER": "off", "TUNECACHE_DATA_DIR": data_dir}
        command = [sys.executable, "-m", "tunecache.service", "serve", "--port", str(port), "--database", url]
        server = subprocess.Popen(command, stdout=log, stderr=log, env=env)
        base = f"http://127.0.0.1:{port}"
        try:
            with httpx.Client(base_url=base, timeout=60) as client:
                for _ in range(300):
                    try:
                        if client.get("/v1/health").status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    if server.poll() is not None:
                        raise SystemExit("tunecache serve exited: " + (Path(data_dir) / "serve.log").read_text())
                    time.sleep(0.1)
                else:
                    raise SystemExit("tunecache serve did not become healthy")

                def get(path: str, params: dict | None = None) -> bytes:
                    answer = client.get(path, params=params)
                    if answer.status_code != 200:
                        raise SystemExit(f"GET {path} {params}: {answer.status_code} {answer.text[:300]}")
                    return answer.content

                def fleet(page: dict) -> Callable[[int], bytes]:
                    return lambda _i: get("/v1/fleet", {"hours": hours, **page})

                timings = [measure("http", f"fleet {name}", fleet(page), warmup, repeat) for name, page in FLEET_PAGES]
                timings.append(measure("http", f"fleet {FLEET_PAGES[0][0]} cold", fleet(FLEET_PAGES[0][1]), warmup,
                                       repeat, before=lambda: move_generation(sessions)))
                for name, params in load.history:
                    timings.append(measure("http", f"history {name}", lambda _i, p=params: get("/v1/tunings", p),
                                           warmup, repeat))

                def diff(i: int) -> bytes:
                    run_a, run_b = load.diff_pairs[i % len(load.diff_pairs)]
                    return get(f"/v1/tunings/{run_a}/diff/{run_b}")

                timings.append(measure("http", f"diff ({len(load.diff_pairs)} run pairs)", diff, warmup, repeat))
                return timings
        finally:
            server.terminate()
            server.wait(timeout=20)
            log.close()


# ------------------------------------------------------------------------------ report


def pytest_running() -> list[str]:
    """Command lines of running pytest processes (other than this one)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if "pytest" in cmdline:
            found.append(f"{proc.name}: {cmdline[:120]}")
    return found


def cpu_probe() -> float:
    """Milliseconds this machine takes for 1,000,000 Python integer additions (best of 5):
    how fast the (shared, possibly throttled) CPU was around the timings."""
    best = math.inf
    for _ in range(5):
        started = time.perf_counter()
        total = 0
        for i in range(1_000_000):
            total += i
        best = min(best, time.perf_counter() - started)
    return round(best * 1000, 1)


def data_sizes(engine: Engine, hours: float) -> dict:
    """Rows of each table the queries read, and what falls in the fleet's window."""
    since = dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=hours)
    with engine.connect() as connection:
        count = lambda sql, **params: connection.scalar(text(sql), params)  # noqa: E731
        return {
            "keys": count("SELECT count(*) FROM tuning_keys"),
            "environments": count("SELECT count(*) FROM environments"),
            "runs": count("SELECT count(*) FROM tuning_runs"),
            "current_tunings": count("SELECT count(*) FROM current_tunings"),
            "distinct_blobs": count("SELECT count(*) FROM artifact_blobs"),
            "reports": count("SELECT count(*) FROM pod_reports"),
            "reported_keys": count("SELECT count(DISTINCT key_hash) FROM pod_reports"),
            "pods": count("SELECT count(DISTINCT pod) FROM pod_reports"),
            "reports_in_window": count("SELECT count(*) FROM pod_reports WHERE received_at >= :s", s=since),
            "misses_in_window": count("SELECT count(*) FROM pod_reports WHERE received_at >= :s AND outcome = 'miss'",
                                      s=since),
            "oldest_report_days": round(float(count(
                "SELECT extract(epoch FROM now() - min(received_at)) / 86400 FROM pod_reports") or 0), 2),
        }


def machine(engine: Engine) -> dict:
    """nproc, CPU model, memory, PostgreSQL and Python versions."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    memory_kib = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                      if line.startswith("MemTotal:"))
    with engine.connect() as connection:
        postgres = connection.scalar(text("SHOW server_version"))
    return {"nproc": os.cpu_count(), "cpu": cpu, "memory_gib": round(memory_kib / 2 ** 20, 1),
            "postgresql": postgres, "python": platform.python_version()}


def table(timings: list[Timing]) -> str:
    """The timings as a fixed-width text table."""
    lines = [f"{'path':6}  {'query':50} {'n':>4} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8} {'bytes':>9}"]
    for t in timings:
        s = t.summary()
        lines.append(f"{s['path']:6}  {s['query'][:50]:50} {s['n']:>4} {s['p50_ms']:>8.2f} {s['p95_ms']:>8.2f} "
                     f"{s['max_ms']:>8.2f} {s['bytes']:>9}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Parse the options, create and seed the database as needed, time, print (see the module)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=DEFAULT_URL, help=f"PostgreSQL URL (default {DEFAULT_URL})")
    parser.add_argument("--reseed", action="store_true", help="drop the database and seed it again")
    parser.add_argument("--seed", type=int, default=20261201, help="random seed of the data")
    parser.add_argument("--keys", type=int, default=Sizes.keys, help="tuned keys (each with --runs-per-key runs)")
    parser.add_argument("--runs-per-key", type=int, default=Sizes.runs_per_key)
    parser.add_argument("--reports", type=int, default=Sizes.reports, help="pod reports over the 7 days of retention")
    parser.add_argument("--pods", type=int, default=Sizes.pods)
    parser.add_argument("--repeat", type=int, default=200, help="timed repetitions per query")
    parser.add_argument("--warmup", type=int, default=20, help="untimed repetitions per query before")
    parser.add_argument("--hours", type=float, default=24, help="the fleet view's window")
    parser.add_argument("--no-http", action="store_true", help="time the routes' code in process only")
    parser.add_argument("--seed-only", action="store_true", help="create and seed, time nothing")
    parser.add_argument("--wait-idle", action="store_true", help="before timing, wait until no pytest runs here")
    parser.add_argument("--json", type=Path, help="also write the results as JSON to this file")
    args = parser.parse_args(argv)
    sizes = Sizes(keys=args.keys, runs_per_key=args.runs_per_key, reports=args.reports, pods=args.pods)

    ensure_database(args.database_url, args.reseed)
    engine = db.create_db_engine(args.database_url, statement_timeout_s=600)
    db.upgrade(engine)
    db.check_schema(engine)
    with engine.connect() as connection:
        runs, stored_reports = (connection.scalar(text(f"SELECT count(*) FROM {t}")) for t in ("tuning_runs", "pod_reports"))
    if runs == 0 and stored_reports == 0:
        seed(args.database_url, sizes, args.seed)
        vacuum_analyze(args.database_url)
    elif (runs, stored_reports) != (sizes.keys * sizes.runs_per_key, sizes.reports):
        raise SystemExit(f"{args.database_url} holds {runs} runs and {stored_reports} reports, not the "
                         f"{sizes.keys * sizes.runs_per_key} and {sizes.reports} asked for: run with --reseed")
    if args.seed_only:
        return 0

    if args.wait_idle:
        while running := pytest_running():
            print(f"waiting for pytest to end: {running[0]}", file=sys.stderr, flush=True)
            time.sleep(30)
    sessions = db.session_factory(engine)
    sizes_now = data_sizes(engine, args.hours)
    about = {"machine": machine(engine), "data": sizes_now, "load_before": os.getloadavg(),
             "cpu_probe_before_ms": cpu_probe(),
             "pytest_before": pytest_running(), "started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
             "repeat": args.repeat, "warmup": args.warmup, "hours": args.hours}
    load = workload(sessions)
    gc.freeze()  # as the service does after startup (tunecache.service.app): GC passes skip what is loaded
    timings = time_direct(sessions, load, args.hours, args.warmup, args.repeat)
    if not args.no_http:
        timings += time_http(args.database_url, sessions, load, args.hours, args.warmup, args.repeat)
    about.update(load_after=os.getloadavg(), pytest_after=pytest_running(), cpu_probe_after_ms=cpu_probe())
    engine.dispose()

    m, d = about["machine"], about["data"]
    print(f"tunecache fleet queries, {about['started_at']}")
    print(f"machine: {m['nproc']} CPUs ({m['cpu']}), {m['memory_gib']} GiB, PostgreSQL {m['postgresql']}, "
          f"Python {m['python']}")
    print(f"load average before {' '.join(f'{x:.2f}' for x in about['load_before'])}, after "
          f"{' '.join(f'{x:.2f}' for x in about['load_after'])}; pytest running: "
          f"{'yes' if about['pytest_before'] or about['pytest_after'] else 'no'}; CPU probe (1e6 Python additions, "
          f"best of 5) {about['cpu_probe_before_ms']} ms before, {about['cpu_probe_after_ms']} ms after")
    print(f"data: {d['keys']} keys, {d['environments']} environments, {d['runs']} runs, {d['current_tunings']} current "
          f"tunings, {d['distinct_blobs']} distinct FlashInfer files; {d['reports']} reports "
          f"({d['reported_keys']} keys, {d['pods']} pods, oldest {d['oldest_report_days']} days), "
          f"{d['reports_in_window']} in the last {args.hours:g} h ({d['misses_in_window']} misses)")
    print(f"fleet pages over the last {args.hours:g} h; each query: {args.warmup} untimed, then {args.repeat} timed; "
          "percentiles nearest-rank; "
          f"direct = the route's code in process, http = GET to a live tunecache serve (1 process)")
    print(table(timings))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({**about, "timings": [t.summary() for t in timings]}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
