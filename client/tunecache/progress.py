"""Terminal progress of a tuning (the tuner's events, or a polled job's state): a rich
progress bar (stage, step/total, elapsed) on a terminal, one plain line per change
otherwise (logs, CI, GPU machines)."""

from __future__ import annotations

import sys
import time
from typing import Any

from tunecache.contract import Stage, StageChanged, StageProgress, TunerEvent, TunerStarted, TuningJobRead
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class ProgressDisplay:
    """Context manager; pass :meth:`update` as ``on_event`` to :func:`run_tuner`."""

    def __init__(self, console: Console | None = None):
        self.console = console or Console(stderr=True)
        self.live = self.console.is_terminal
        self.started = time.monotonic()
        self.progress = Progress(
            TextColumn("[bold]{task.fields[stage]}[/bold] {task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.console,
            disable=not self.live,
        )
        self.tasks: dict[str, Any] = {}
        self._last_step: dict[str, tuple[int, int]] = {}

    def __enter__(self) -> "ProgressDisplay":
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(*exc)

    def _line(self, text: str) -> None:
        if not self.live:
            print(f"[{time.monotonic() - self.started:7.1f}s] {text}", file=sys.stderr, flush=True)

    def update(self, event: TunerEvent) -> None:
        """Show one tuner event (:data:`tunecache.contract.TunerEvent`)."""
        if isinstance(event, TunerStarted):
            self._line(f"tuning on {event.gpu_name} ({event.arch})")
        elif isinstance(event, StageChanged) and event.status == "running":
            self.tasks[event.stage] = self.progress.add_task("starting", stage=str(event.stage), total=None)
            self._line(f"stage {event.stage}: running")
        elif isinstance(event, StageChanged) and event.status == "skipped":
            message = f"stage {event.stage}: skipped ({event.reason})"
            if self.live:
                self.progress.console.print(message)
            self._line(message)
        elif isinstance(event, StageChanged) and event.status == "done":
            self._line(f"stage {event.stage}: done in {event.seconds or 0:.1f} s")
        elif isinstance(event, StageProgress) and event.stage in self.tasks:
            self.progress.update(self.tasks[event.stage], completed=event.step, total=event.total, description=event.detail)
            self._line(f"stage {event.stage}: {event.step}/{event.total} {event.detail}")
        # a TunerError is not shown here: the command ends with it, in one line

    def update_from_job(self, job: TuningJobRead) -> None:
        """Show a polled ``GET /v1/tuning-jobs/{id}`` answer as the tuner events it implies."""
        if job.stage is None or job.stage not in set(Stage):
            return
        stage = Stage(job.stage)
        if stage not in self.tasks:
            self.update(StageChanged(stage=stage, status="running"))
        if job.step is not None and job.total is not None and (job.step, job.total) != self._last_step.get(stage):
            self._last_step[stage] = (job.step, job.total)
            detail = (job.log_tail or "").splitlines()[-1:] or [""]
            self.update(StageProgress(stage=stage, step=job.step, total=job.total, detail=detail[0]))
