"""Reading FlashInfer autotune cache files (the "v1" JSON file of ``AutoTuner.save_configs``).

The file is FlashInfer's own format and is stored and installed byte for byte; this
module only reads the two things tunecache needs from it: the ``_metadata`` block
(the environment it was tuned in) and the number of tuning entries. Loading it into
FlashInfer is FlashInfer's job (``AutoTuner.get().load_configs(path)``).

Layout (``flashinfer/autotuner/autotuner.py``, ``AutoTuner.save_configs``)::

    {"_metadata": {...}, "_generation": "<sha256>",              # underscore keys: bookkeeping
     "('bf16_gemm', 'CudnnBf16GemmRunner', ...)": [runner_class, tactic, policy, selection],
     ...}
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from tunecache.contract import ArtifactCreate, ArtifactKind, EnvironmentMetadata, RunTrigger, TuningKey, TuningRunCreate

#: The name of FlashInfer's file among a run's artifacts.
AUTOTUNE_FILE_NAME = "autotune.json"


class NotAnAutotuneFile(ValueError):
    """The bytes are not a FlashInfer autotune cache file with a ``_metadata`` block."""


@dataclass(frozen=True)
class AutotuneFile:
    """What tunecache reads from a FlashInfer autotune cache file."""

    environment: EnvironmentMetadata
    entries: int
    """Number of tuning entries (keys that do not start with ``_``)."""


def parse_autotune_file(data: bytes, source: str = "file") -> AutotuneFile:
    """Read the environment and entry count of a FlashInfer autotune cache file.

    Args:
        data: the file's bytes (UTF-8 JSON).
        source: how to name the file in error messages.

    Raises:
        NotAnAutotuneFile: not JSON, not an object, no ``_metadata`` object, or a
            ``_metadata`` field that is not a usable string (named).
    """
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise NotAnAutotuneFile(f"{source} is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise NotAnAutotuneFile(f"{source} is not a FlashInfer autotune file (top level is not an object)")
    metadata = doc.get("_metadata")
    if not isinstance(metadata, dict):
        raise NotAnAutotuneFile(
            f"{source} has no _metadata block: not a FlashInfer (>= 0.6) autotune cache file"
        )
    try:
        environment = EnvironmentMetadata.from_flashinfer_metadata(metadata)
    except ValueError as exc:
        raise NotAnAutotuneFile(f"{source}: {exc}") from None
    return AutotuneFile(
        environment=environment,
        entries=sum(1 for k in doc if not k.startswith("_")),
    )


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
