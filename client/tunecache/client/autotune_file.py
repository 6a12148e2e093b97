"""The run record of a FlashInfer autotune file a pod pushes as it is.

Reading the file is :mod:`tunecache.formats.autotune_file` (the tuner and the service read
it too).
"""

from __future__ import annotations

from tunecache.contract import ArtifactCreate, ArtifactKind, RunTrigger, TuningKey, TuningRunCreate
from tunecache.formats.autotune_file import AUTOTUNE_FILE_NAME, AutotuneFile


def pushed_run(key: TuningKey, parsed: AutotuneFile, sha256: str, trigger: RunTrigger | str, node: str | None) -> TuningRunCreate:
    """The run record of a FlashInfer file uploaded as it is (``tunecache push``, a pod's
    push-back): one ``flashinfer_autotune_v1`` artifact (bytes already uploaded under
    ``sha256``), the file's environment and entry count."""
    kind = ArtifactKind.FLASHINFER_AUTOTUNE
    return TuningRunCreate(
        key=key,
        environment=parsed.environment,
        trigger=RunTrigger(trigger),
        node=node,
        summary={"entries": parsed.entries},
        artifacts=[ArtifactCreate(kind=kind, name=AUTOTUNE_FILE_NAME, media_type=kind.media_type, sha256=sha256)],
    )
