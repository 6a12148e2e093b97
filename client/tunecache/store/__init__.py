"""The stores of tunings, side by side (as MLflow keeps its stores in one ``store`` package):
the interface and the errors every store raises (:mod:`.base`), and the HTTP store, the
client of a tunecache service (:mod:`.http`). The SQL store is the service's
(``tunecache.service.store.SqlTuningStore`` in ``tunecache-server``).

Both distributions import this package: the pods and the pod commands, and the server's
``tune --server`` (an import-linter contract lets the service import ``tunecache.store``
and nothing else of the client's code but the contract, the formats and the command kit).
It imports no pod code. The names of :mod:`.base` are re-exported here, so ``from
tunecache.store import TuningStore`` holds.
"""

from tunecache.store.base import (
    AnswerTooLarge,
    ArtifactCorrupt,
    ArtifactsMissing,
    DownloadTruncated,
    InstallDeadlineExceeded,
    JobConflictError,
    NoCompatibleTuning,
    ServerError,
    ServerUnreachable,
    TunecacheError,
    TuningStore,
    file_sha256,
    record_uploaded,
)

__all__ = [
    "AnswerTooLarge", "ArtifactCorrupt", "ArtifactsMissing", "DownloadTruncated", "InstallDeadlineExceeded",
    "JobConflictError", "NoCompatibleTuning", "ServerError", "ServerUnreachable", "TunecacheError", "TuningStore",
    "file_sha256", "record_uploaded",
]
