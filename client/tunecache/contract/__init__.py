"""The contract both sides of tunecache speak: identity, names, and the API's models.

Everything that crosses the wire between a pod (``tunecache-client``) and the service
(``tunecache-server``), or that both store and compare, is defined in this package once,
one module per role:

* :mod:`.identity`: :class:`TuningKey` (what a pod asks for; :data:`KEY_FIELDS` is read
  from it) and :class:`EnvironmentMetadata` (FlashInfer's ``_metadata`` fields),
  :func:`differences` between two of them, :func:`expert_parallel_size`, the shared
  validators;
* :mod:`.kinds`: :class:`ArtifactKind` and :data:`KINDS`, each kind's facts
  (:class:`KindFacts`: media type, signature needed, fetch option, packages it depends on);
* :mod:`.runs`: :class:`RunStatus`,
  :class:`RunTrigger`; :class:`ArtifactCreate`, :class:`TuningRunCreate`,
  :class:`LookupRequest`, :class:`TuningRunRead`, :class:`LookupMiss`,
  :class:`ArtifactStored`, :class:`RunSignature`, :class:`RunVerification`;
* :mod:`.history`: :class:`TuningRunQuery` (with the history's cursors),
  :class:`TuningRunPage`, the history's CSV export (:func:`run_csv_row`);
* :mod:`.diffs`: :class:`TuningRunDiff` (a run diff) and its entries;
* :mod:`.jobs`: :class:`JobStatus`, :class:`TuningJobCreate` (and the :class:`JobOptions` a job keeps), :class:`TuningJobRead`,
  :class:`TuningJobPage`, :class:`JobConflict`, :class:`WorkerList`, :class:`Health`;
* :mod:`.reports`: :class:`PodReportCreate` (a pod's install report) and :class:`FleetView`
  (the fleet matrix and the tunings pods want);
* :mod:`.tokens`: :class:`Scope`, :class:`TokenCreate`, :class:`TokenRead`, the audit log;
* :mod:`.errors`: :class:`ErrorBody`, :class:`FieldError`;
* :mod:`.events`: :class:`Stage` and the tuner's progress events, one discriminated union
  (:data:`TunerEvent`), read by the service's worker and by the client's progress bar.

Write models are ``extra="forbid"`` (a misspelt field is an error); read models ignore
unknown fields, so an older client reads a newer server.

This module re-exports every public name of those modules, so ``from tunecache.contract
import X`` keeps working wherever it is written (the package was one module before); new
code may import from either. The service builds its SQL schema's constraints and its
routes from these; the client returns these models, never dicts. Pure Python: pydantic only.
"""

from tunecache.contract.identity import (
    DeploymentKey,
    differences,
    ENVIRONMENT_FIELDS,
    DEFAULT_ENGINE,
    ENGINE_NAMES,
    EngineName,
    EnvironmentMetadata,
    expert_parallel_size,
    FieldDifference,
    GpuKey,
    INDETERMINATE_VALUES,
    KEY_FIELDS,
    MAX_ID,
    MAX_JSON_DEPTH,
    MAX_NUM_BATCHED_TOKENS,
    NO_NUL,
    NOT_TRACKED,
    SHA256_PATTERN,
    StrEnum,
    Text,
    TuningKey,
    Variant,
    VARIANT_PATTERN,
    WholeNumber,
)
from tunecache.contract.engine_args import allowed_engine_args, check_engine_args, EngineArgRefused, EngineArgs
from tunecache.contract.kinds import (
    ArtifactKind,
    JSON_MEDIA_TYPE,
    KINDS,
    KindFacts,
    kinds_where,
    TAR_GZ_MEDIA_TYPE,
)
from tunecache.contract.runs import (
    ArtifactCreate,
    ArtifactRead,
    ArtifactStored,
    ClosestTuning,
    LookupMiss,
    LookupRequest,
    PromoteRequest,
    RunSignature,
    RunStatus,
    MAX_AUTOTUNE_FILE_BYTES,
    RunTrigger,
    RunVerification,
    compiled_summary,
    TuningRunCreate,
    TuningRunRead,
)
from tunecache.contract.history import (
    decode_run_cursor,
    encode_run_cursor,
    IsoDateTime,
    CSV_FORMULA_PREFIXES,
    RUN_CSV_COLUMNS,
    csv_text_cell,
    run_csv_row,
    TuningRunPage,
    TuningRunQuery,
)
from tunecache.contract.diffs import (
    EntryChange,
    TacticChange,
    TuningRunDiff,
    TuningRunDiffSummary,
)
from tunecache.contract.jobs import (
    ACTIVE_JOB_STATUSES,
    Health,
    JobConflict,
    JobOptionDifference,
    JobOptions,
    JobStatus,
    MAX_HF_CONFIG_BYTES,
    TuningJobCreate,
    TuningJobPage,
    TuningJobRead,
    WorkerList,
    WorkerRead,
    WorkerStatus,
)
from tunecache.contract.reports import (
    AUTO_TUNE_REFUSALS,
    FLEET_PAGE_DEFAULT,
    FLEET_MAX_HOURS,
    FLEET_PAGE_MAX,
    FleetKey,
    FleetVariant,
    FleetRun,
    FleetView,
    BOOT_ID_PATTERN,
    MAX_REPORT_BYTES,
    PodReportCreate,
    ReportedDifference,
    ReportOutcome,
    ReportSource,
    CompiledKind,
    WantedTuning,
)
from tunecache.contract.tokens import (
    AuditEventRead,
    AuditPage,
    Scope,
    TOKEN_NAME_PATTERN,
    TokenCreate,
    TokenCreated,
    TokenRead,
)
from tunecache.contract.errors import (
    ErrorBody,
    FieldError,
)
from tunecache.contract.events import (
    Stage,
    StageChanged,
    StageProgress,
    TUNABLE_STAGES,
    TunableStage,
    TUNER_EVENT,
    TunerError,
    TunerEvent,
    TunerFinished,
    TunerStarted,
)
from tunecache.contract.retirement import RunRetired

__all__ = [
    "ACTIVE_JOB_STATUSES",
    "ArtifactCreate",
    "ArtifactKind",
    "ArtifactRead",
    "ArtifactStored",
    "AUTO_TUNE_REFUSALS",
    "AuditEventRead",
    "AuditPage",
    "ClosestTuning",
    "DeploymentKey",
    "ENVIRONMENT_FIELDS",
    "EngineArgRefused",
    "EngineArgs",
    "allowed_engine_args",
    "check_engine_args",
    "EntryChange",
    "EnvironmentMetadata",
    "ErrorBody",
    "FLEET_PAGE_DEFAULT",
    "FLEET_MAX_HOURS",
    "FLEET_PAGE_MAX",
    "FieldDifference",
    "FieldError",
    "FleetKey",
    "FleetVariant",
    "FleetRun",
    "FleetView",
    "GpuKey",
    "Health",
    "INDETERMINATE_VALUES",
    "IsoDateTime",
    "JSON_MEDIA_TYPE",
    "JobConflict",
    "JobOptionDifference",
    "JobStatus",
    "KEY_FIELDS",
    "DEFAULT_ENGINE",
    "ENGINE_NAMES",
    "EngineName",
    "KINDS",
    "KindFacts",
    "kinds_where",
    "LookupMiss",
    "LookupRequest",
    "PromoteRequest",
    "MAX_HF_CONFIG_BYTES",
    "MAX_ID",
    "MAX_JSON_DEPTH",
    "MAX_NUM_BATCHED_TOKENS",
    "BOOT_ID_PATTERN",
    "MAX_REPORT_BYTES",
    "NOT_TRACKED",
    "NO_NUL",
    "PodReportCreate",
    "CSV_FORMULA_PREFIXES",
    "RUN_CSV_COLUMNS",
    "csv_text_cell",
    "ReportOutcome",
    "ReportSource",
    "CompiledKind",
    "ReportedDifference",
    "RunSignature",
    "RunStatus",
    "MAX_AUTOTUNE_FILE_BYTES",
    "RunTrigger",
    "RunVerification",
    "compiled_summary",
    "SHA256_PATTERN",
    "Scope",
    "Stage",
    "StageChanged",
    "StageProgress",
    "StrEnum",
    "TAR_GZ_MEDIA_TYPE",
    "TOKEN_NAME_PATTERN",
    "TUNABLE_STAGES",
    "TUNER_EVENT",
    "TacticChange",
    "Text",
    "TokenCreate",
    "TokenCreated",
    "TokenRead",
    "TunableStage",
    "TunerError",
    "TunerEvent",
    "TunerFinished",
    "TunerStarted",
    "JobOptions",
    "TuningJobCreate",
    "TuningJobPage",
    "TuningJobRead",
    "TuningKey",
    "TuningRunCreate",
    "TuningRunDiff",
    "TuningRunDiffSummary",
    "TuningRunPage",
    "TuningRunQuery",
    "TuningRunRead",
    "WantedTuning",
    "WholeNumber",
    "WorkerList",
    "WorkerRead",
    "WorkerStatus",
    "decode_run_cursor",
    "differences",
    "encode_run_cursor",
    "expert_parallel_size",
    "run_csv_row",
    "RunRetired",
]
