"""Parent side of the tuner: run the child process, stream its progress, enforce a timeout.

The child (:mod:`tunecache.service.tuner.child`) imports torch and FlashInfer and owns the
GPU; a CUDA fault or a hang there kills only the child, never the service.
"""

from __future__ import annotations

import datetime as dt
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pydantic import ValidationError

from tunecache.contract import (
    TUNER_EVENT,
    ArtifactCreate,
    EnvironmentMetadata,
    RunStatus,
    RunTrigger,
    TunerError,
    TunerEvent,
    TunerFinished,
    TunerStarted,
    TuningRunCreate,
    TuningRunRead,
)
from tunecache.service.tuner.guard import PARENT_PID_VARIABLE
from tunecache.service.tuner.stages import TuneSpec
from tunecache.signing import sign_run
from tunecache.store import TuningStore, file_sha256

#: Lines of the child's stderr kept for error reports.
LOG_TAIL_LINES = 40
#: Seconds a cancelled child gets to exit after SIGTERM before its process group is killed.
CANCEL_GRACE_S = 5.0


class TunerCancelled(RuntimeError):
    """The tuning was cancelled (``run_tuner``'s ``cancel`` was set): the child's process
    group was terminated and nothing it made is kept. ``log_tail``: the child's last
    lines of stderr."""

    def __init__(self, message: str, log_tail: str = ""):
        super().__init__(message)
        self.message = message
        self.log_tail = log_tail


@dataclass
class TunerFailed(RuntimeError):
    """The child failed, crashed or timed out. ``started`` holds its "started" event if it got that far."""

    message: str
    log_tail: str = ""
    started: TunerStarted | None = None
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None

    def __str__(self) -> str:
        return self.message

    def run_record(self, spec: TuneSpec, trigger: RunTrigger, node: str | None) -> TuningRunCreate | None:
        """A ``failed`` run for the history, or ``None`` when the child died before it knew
        its GPU (without a GPU name there is no key to file the failure under)."""
        if self.started is None:
            return None
        return TuningRunCreate(
            key=spec.deployment.on_gpu(self.started.gpu_name, self.started.arch),
            environment=EnvironmentMetadata.from_flashinfer_metadata(self.started.environment),
            status=RunStatus.FAILED,
            trigger=trigger,
            node=node,
            started_at=self.started_at,
            finished_at=self.finished_at,
            error=f"{self.message}\n{self.log_tail}".strip()[:65536],
        )


@dataclass
class TunerResult:
    """A finished tuning: FlashInfer's cache file plus what the child measured."""

    gpu_name: str
    arch: str
    environment: EnvironmentMetadata
    summary: dict[str, Any]
    artifacts: list[tuple[ArtifactCreate, Path]] = field(default_factory=list)
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None

    def run_record(self, spec: TuneSpec, trigger: RunTrigger, node: str | None,
                   signing_key: Ed25519PrivateKey | None = None) -> TuningRunCreate:
        """The ``POST /v1/tunings`` body of this result (artifacts must be stored first),
        signed with ``signing_key`` (:func:`tunecache.signing.sign_run`) when one is given."""
        key = spec.deployment.on_gpu(self.gpu_name, self.arch)
        artifacts = [a for a, _ in self.artifacts]
        summary = {**self.summary, **({"engine_args": spec.engine_args} if spec.engine_args else {})}
        return TuningRunCreate(
            key=key,
            environment=self.environment,
            status=RunStatus.SUCCEEDED,
            trigger=trigger,
            node=node,
            started_at=self.started_at,
            finished_at=self.finished_at,
            summary=summary,
            artifacts=artifacts,
            signature=(sign_run(signing_key, key, self.environment, artifacts, summary)
                       if signing_key is not None else None),
            variant=self.variant,
        )

    @property
    def variant(self) -> str | None:
        """The engine variant of the run's compile cache (``summary.vllm_compile.variant_factors``:
        :class:`tunecache.engines.vllm.compile_cache.VariantFactors`), ``None`` without one."""
        from tunecache.engines.vllm.compile_cache import VariantFactors

        compiled = self.summary.get("vllm_compile") or {}
        factors = compiled.get("variant_factors") if isinstance(compiled, dict) else None
        return VariantFactors.model_validate(factors).variant if factors else None

    def record(self, store: TuningStore, spec: TuneSpec, trigger: RunTrigger, node: str | None,
               signing_key: Ed25519PrivateKey | None = None) -> TuningRunRead:
        """Store the result in ``store`` (a server or the database: :class:`tunecache.store.TuningStore`):
        every artifact's bytes first (streamed; skipped when the store has them), then the
        run, signed with ``signing_key`` when given (pods install JIT modules and DeepGEMM
        caches only from signed runs).

        Raises:
            whatever the store raises (ServerError, ServerUnreachable over HTTP; database errors).
        """
        from tunecache.store import record_uploaded

        # bytes the service's retention deleted meanwhile are uploaded again (record_uploaded)
        return record_uploaded(store, self.run_record(spec, trigger, node, signing_key),
                               [path for _artifact, path in self.artifacts])


def _terminate(child: subprocess.Popen) -> None:
    """SIGTERM the child's process group; SIGKILL it after :data:`CANCEL_GRACE_S` seconds."""
    try:
        os.killpg(child.pid, signal.SIGTERM)
    except ProcessLookupError:  # already gone
        return
    try:
        child.wait(CANCEL_GRACE_S)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def run_tuner(
    spec: TuneSpec,
    work_dir: Path,
    timeout_s: float,
    on_event: Callable[[TunerEvent], None] | None = None,
    cancel: threading.Event | None = None,
) -> TunerResult:
    """Tune ``spec`` in a child process whose files go to ``work_dir``.

    Args:
        spec: what to tune.
        work_dir: an empty directory; receives ``spec.json``, ``tuner.log`` (the child's
            stderr), ``autotune.json`` (FlashInfer's file) and ``result.json``.
        timeout_s: wall-clock limit in seconds; the child's process group is killed after it.
        on_event: called with every event the child emits (progress bars, job status);
            lines that are not a :data:`tunecache.contract.TunerEvent` are skipped.
        cancel: when set (checked at least once a second), the child's process group gets
            SIGTERM, and SIGKILL after :data:`CANCEL_GRACE_S` seconds if it is still there.

    Raises:
        TunerFailed: the child reported an error, died (e.g. a CUDA fault), or timed out.
        TunerCancelled: ``cancel`` was set before the child finished.
    """
    work_dir.mkdir(parents=True, exist_ok=True)
    spec_path = work_dir / "spec.json"
    spec_path.write_text(spec.model_dump_json())
    log_path = work_dir / "tuner.log"
    started_at = dt.datetime.now(dt.timezone.utc)
    events: queue.Queue[TunerEvent | None] = queue.Queue()
    with open(log_path, "wb") as log:
        child = subprocess.Popen(
            [sys.executable, "-m", "tunecache.service.tuner.child", str(spec_path), str(work_dir)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", PARENT_PID_VARIABLE: str(os.getpid())},  # dies with us
        )

    def read_events() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            try:
                events.put(TUNER_EVENT.validate_json(line))
            except ValidationError:
                continue
        events.put(None)

    reader = threading.Thread(target=read_events, daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout_s
    first: TunerStarted | None = None
    result: TunerFinished | None = None
    error: str | None = None
    timed_out = cancelled = False
    while True:
        if cancel is not None and cancel.is_set():
            cancelled = True
            _terminate(child)
            break
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            timed_out = True
            os.killpg(child.pid, signal.SIGKILL)
            break
        try:
            event = events.get(timeout=min(remaining, 1.0))
        except queue.Empty:
            continue
        if event is None:
            break
        if isinstance(event, TunerStarted):
            first = event
        elif isinstance(event, TunerFinished):
            result = event
        elif isinstance(event, TunerError):
            error = event.message
        if on_event is not None:
            on_event(event)
    returncode = child.wait()
    reader.join(timeout=5)
    finished_at = dt.datetime.now(dt.timezone.utc)

    def failed(message: str) -> TunerFailed:
        return TunerFailed(message, _tail(log_path), first, started_at, finished_at)

    if cancelled:
        raise TunerCancelled(f"tuning cancelled after {(finished_at - started_at).total_seconds():.1f} s", _tail(log_path))
    if timed_out:
        raise failed(f"tuning timed out after {timeout_s:g} s")
    if returncode != 0 or result is None:
        if error:
            raise failed(error)
        how = f"signal {signal.Signals(-returncode).name}" if returncode < 0 else f"exit status {returncode}"
        raise failed(f"tuner process died with {how}")
    summary = result.summary
    artifacts = [
        (ArtifactCreate(kind=a["kind"], name=a["name"], media_type=a["media_type"], sha256=file_sha256(work_dir / a["path"])),
         work_dir / a["path"])
        for a in summary["artifacts"]
    ]
    return TunerResult(
        gpu_name=summary["gpu_name"],
        arch=summary["arch"],
        environment=EnvironmentMetadata.model_validate(summary["environment"]),
        summary={k: summary[k] for k in ("entries", "tuning_seconds", "stages", "jit_modules", "flashinfer_jit",
                                          "vllm_compile", "dependencies", "deep_gemm_m_set") if k in summary},
        artifacts=artifacts,
        started_at=started_at,
        finished_at=finished_at,
    )
