"""Terminal progress of a tuning (the tuner's events, or a polled job's state): a rich
progress bar (stage, step/total, elapsed) on a terminal, one plain line per change
otherwise (logs, CI, GPU machines)."""

from __future__ import annotations

import sys
import time
from typing import Any

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
        self._last_step: dict[str, tuple[int, int | None]] = {}

    def __enter__(self) -> "ProgressDisplay":
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(*exc)

    def _line(self, text: str) -> None:
        if not self.live:
            print(f"[{time.monotonic() - self.started:7.1f}s] {text}", file=sys.stderr, flush=True)

    def update(self, event: dict[str, Any]) -> None:
        kind, stage = event.get("event"), event.get("stage", "")
        if kind == "started":
            self._line(f"tuning on {event['gpu_name']} ({event['arch']})")
        elif kind == "stage" and event["status"] == "running":
            self.tasks[stage] = self.progress.add_task("starting", stage=stage, total=None)
            self._line(f"stage {stage}: running")
        elif kind == "stage" and event["status"] == "skipped":
            message = f"stage {stage}: skipped ({event['reason']})"
            if self.live:
                self.progress.console.print(message)
            self._line(message)
        elif kind == "stage" and event["status"] == "done":
            self._line(f"stage {stage}: done in {event['seconds']:.1f} s")
        elif kind == "progress" and stage in self.tasks:
            self.progress.update(self.tasks[stage], completed=event["step"], total=event["total"], description=event["detail"])
            self._line(f"stage {stage}: {event['step']}/{event['total']} {event['detail']}")
        elif kind == "error":
            self._line(f"error: {event['message']}")

    def update_from_job(self, job: dict[str, Any]) -> None:
        """Show a polled ``GET /v1/tuning-jobs/{id}`` body as the tuner events it implies."""
        stage = job.get("stage")
        if stage and stage not in self.tasks:
            self.update({"event": "stage", "stage": stage, "status": "running"})
        step, total = job.get("step"), job.get("total")
        if stage and step is not None and (step, total) != self._last_step.get(stage):
            self._last_step[stage] = (step, total)
            detail = (job.get("log_tail") or "").splitlines()[-1:] or [""]
            self.update({"event": "progress", "stage": stage, "step": step, "total": total, "detail": detail[0]})
