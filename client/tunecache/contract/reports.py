"""Pods' install reports and the fleet view built from them."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tunecache.contract.engine_args import EngineArgs
from tunecache.contract.identity import (ENVIRONMENT_FIELDS, KEY_FIELDS, MAX_ID, SHA256_PATTERN, EnvironmentMetadata,
                                         FieldDifference, StrEnum, Text, TuningKey, Variant, WholeNumber)
from tunecache.contract.kinds import ArtifactKind
from tunecache.contract.runs import CompiledKind, RunTrigger


class ReportOutcome(StrEnum):
    """How a pod's install ended (:class:`PodReportCreate`).

    * ``installed``: the tuning (run ``run_id``) is in place for FlashInfer or vLLM;
    * ``miss``: the server has no tuning for the pod's key and environment (a lookup's
      404); vLLM tunes as without tunecache;
    * ``error``: something on the pod kept the install from happening (an untrusted run, a
      corrupt artifact, a full disk, ...): ``error_kind`` names it. (A server that could not
      be reached or failed is not sent a report: it would not take one either.)
    """

    INSTALLED = "installed"
    MISS = "miss"
    ERROR = "error"


class ReportSource(StrEnum):
    """Which install reported: ``tunecache pull`` (``cli``), the Python API
    (``install_tuning``, ``pull_autotune_file``: ``api``) or the vLLM plugin (``plugin``)."""

    CLI = "cli"
    API = "api"
    PLUGIN = "plugin"


#: Largest body of ``POST /v1/reports`` (bytes); a larger one is answered 413.
MAX_REPORT_BYTES = 32 * 1024
#: A pod boot's id (:attr:`PodReportCreate.boot_id`): 8-64 letters, digits, ``-``, ``_``, ``.``.
BOOT_ID_PATTERN = r"^[A-Za-z0-9_.-]{8,64}$"
_FIELD_NAMES_PATTERN = "^(" + "|".join((*KEY_FIELDS, *ENVIRONMENT_FIELDS)) + ")$"


class ReportedDifference(BaseModel):
    """A field in which the closest stored tuning differs from what a pod asked for, as the
    lookup's 404 named it (:class:`FieldDifference`)."""

    model_config = ConfigDict(extra="forbid")

    field: str = Field(pattern=_FIELD_NAMES_PATTERN, description="a key or environment field")
    stored: Text = Field(max_length=4096)
    yours: Text = Field(max_length=4096)


#: At most this many runs a report names (:attr:`PodReportCreate.installed_from`): a boot installs
#: from one run, and an engine variant's compile cache from another.
MAX_INSTALLED_FROM = 8


class PodReportCreate(BaseModel):
    """Body of ``POST /v1/reports``: what one install on a pod came to, sent after it
    finished (best-effort, in the background: it never delays or fails an install).

    * ``key``, ``environment_hash``: what the pod asked for; ``environment``: the pod's
      FlashInfer environment in full, sent with a ``miss`` (so the fleet view can show what
      was wanted), optional otherwise; when given it must hash to ``environment_hash``;
    * ``outcome`` (:class:`ReportOutcome`): ``installed`` needs ``run_id`` (the run
      installed); ``miss`` may carry the closest run (``run_id``) and its ``differences``
      as the lookup's 404 named them; ``error`` needs ``error_kind`` (the error's class,
      e.g. ``UntrustedRun``, ``ArtifactCorrupt``, ``OSError``);
    * ``install_seconds``: from the start of the install to its end, seconds;
    * ``jit_modules`` / ``jit_skipped``: FlashInfer JIT modules installed, and those of the
      run not installed (unsigned run, built elsewhere, no workspace);
    * ``pod`` (the hostname), ``rank`` (vLLM's rank of the worker; ``None`` outside vLLM),
      ``source`` (:class:`ReportSource`), ``looked_up``: whether this install asked the
      server itself (``False``: a vLLM worker that took its pod's first worker's result);
    * ``boot_id``: the pod boot this install belongs to (a random id the pod makes once per
      boot and every rank of the boot sends: :func:`tunecache.client.report.boot_id`); the
      fleet view counts a boot once, however many of its reports arrive. ``None`` (clients
      before it): each report counts as a boot of its own;
    * ``compiled``: the boot's attestation, what this worker's boot still compiled, by
      :class:`CompiledKind` (sent by the vLLM plugin once the worker warmed up; ``None``:
      not counted); a boot at the floor has every count 0;
    * ``variant``: the pod's engine variant (when the plugin computed it);
      ``variant_missing``: no warm state is stored for it (the pod got the key's run without
      its compile cache); ``engine_args``: the vLLM engine arguments the pod was booted with
      beyond vLLM's defaults, which name the variant (what ``retune --engine-args`` takes);
    * ``missing_kinds`` (``installed`` only): the kinds of the installed run the pod left out as
      built with other package versions than its own (another image's run: no run of the key
      is current for the pod's image).
    * ``installed_from``: every run whose artifacts this boot installed (the warm state's, the
      tactics', an engine variant's compile cache's), each once, in order; empty: not said (a
      client before it). A boot installs the warm state and the tactics of one run.

    Nothing in a report chooses a path, a tuning or a token: the service only counts it.
    """

    model_config = ConfigDict(extra="forbid")

    key: TuningKey
    environment_hash: str = Field(pattern=SHA256_PATTERN)
    environment: EnvironmentMetadata | None = None
    outcome: ReportOutcome
    run_id: WholeNumber | None = Field(default=None, ge=1, le=MAX_ID)
    differences: list[ReportedDifference] = Field(default_factory=list, max_length=len(KEY_FIELDS) + len(ENVIRONMENT_FIELDS))
    error_kind: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_.]{0,63}$")
    install_seconds: float = Field(ge=0, le=86400)
    jit_modules: WholeNumber = Field(default=0, ge=0, le=100_000)
    jit_skipped: WholeNumber = Field(default=0, ge=0, le=100_000)
    pod: Text = Field(min_length=1, max_length=255)
    rank: WholeNumber | None = Field(default=None, ge=0, le=1 << 20)
    source: ReportSource
    looked_up: bool = True
    boot_id: str | None = Field(default=None, pattern=BOOT_ID_PATTERN)
    compiled: dict[CompiledKind, Annotated[int, Field(ge=0, le=1_000_000)]] | None = None
    variant: Variant | None = None
    variant_missing: bool = False
    engine_args: EngineArgs | None = None
    missing_kinds: list[ArtifactKind] = Field(default_factory=list, max_length=len(ArtifactKind))
    installed_from: list[Annotated[WholeNumber, Field(ge=1, le=MAX_ID)]] = Field(
        default_factory=list, max_length=MAX_INSTALLED_FROM)

    @model_validator(mode="after")
    def _consistent(self) -> "PodReportCreate":
        if self.variant_missing and self.variant is None:
            raise ValueError("variant_missing needs the variant")
        if self.missing_kinds and self.outcome is not ReportOutcome.INSTALLED:
            raise ValueError("missing_kinds belong to installed reports (kinds of the run installed)")
        if len(set(self.missing_kinds)) != len(self.missing_kinds):
            raise ValueError("missing_kinds names a kind twice")
        if self.environment is not None and self.environment.environment_hash() != self.environment_hash:
            raise ValueError("environment_hash is not the hash of environment")
        if self.outcome is ReportOutcome.INSTALLED and self.run_id is None:
            raise ValueError("an installed report needs run_id (the run installed)")
        if self.outcome is ReportOutcome.ERROR and self.error_kind is None:
            raise ValueError("an error report needs error_kind")
        if self.outcome is not ReportOutcome.ERROR and self.error_kind is not None:
            raise ValueError(f"error_kind belongs to error reports, not {self.outcome} ones")
        if len(set(self.installed_from)) != len(self.installed_from):
            raise ValueError("installed_from names a run twice")
        if self.outcome is not ReportOutcome.MISS and self.differences:
            raise ValueError("differences belong to miss reports")
        return self


class FleetRun(BaseModel):
    """A key's current run in one environment (``GET /v1/fleet``)."""

    run_id: int
    environment_hash: str
    flashinfer_version: str
    created_at: dt.datetime
    age_s: float
    """Seconds since the run was recorded, by the service's clock."""
    entries: int | None
    trigger: RunTrigger
    vllm_version: str | None = None
    """The vLLM its warm state was made with (``None``: no compile cache recorded): with
    ``flashinfer_version`` and ``torch_version``, the image a key has a warm state for."""
    torch_version: str | None = None


#: Why an automatic tuning of an engine variant was not queued (``TUNECACHE_AUTO_TUNE_VARIANTS``;
#: ``tunecache_auto_tune_refused_total{reason}`` and the fleet view count them):
#:
#: * ``anonymous``: a report of the variant missing sent without a token: stored, never counted;
#: * ``tokens``: fewer distinct tokens than the setting reported the variant missing;
#: * ``repeat``: a job with the same engine arguments was queued for the key within the window;
#: * ``key_busy``: another job of the key is queued or running;
#: * ``budget_key``, ``budget_hour``, ``budget_queued``: the key's automatic jobs of the last
#:   hour, the fleet's, or those queued or running now, are at their bound.
AUTO_TUNE_REFUSALS = ("anonymous", "tokens", "repeat", "key_busy", "budget_key", "budget_hour", "budget_queued")


class FleetVariant(BaseModel):
    """One engine variant of a key in one environment, as pods reported it over the window:
    ``boots`` that reported it, ``missing`` those that found no warm state for it,
    ``current_run_id``: the variant's current run now (``None``: none), ``engine_args``: what
    the latest report named it with."""

    variant: str
    environment_hash: str
    key: TuningKey | None = None
    """The key (in ``wanted_variants``; a :class:`FleetKey`'s variants are its own)."""
    boots: int
    missing: int
    pods: int
    current_run_id: int | None
    engine_args: dict[str, Any] | None
    last_report_at: dt.datetime
    auto_tune_refused: dict[str, int] = {}
    """Automatic tunings of the variant refused in the window, by reason
    (:data:`AUTO_TUNE_REFUSALS`), counted by the hour they were refused in."""


class FleetKey(BaseModel):
    """One row of the fleet matrix: a key with its current runs (one per environment that
    has one; none when only pods' reports name the key) and what pods reported for it over
    the window, in pod boots (a boot counts once per outcome however many reports it sent;
    a report without ``boot_id`` counts as a boot of its own): ``reports`` in all,
    ``installed``, ``missed``, ``errors``, and ``hit_rate`` = ``installed / reports``
    (``None`` without reports)."""

    key: TuningKey
    current: list[FleetRun]
    reports: int
    installed: int
    missed: int
    errors: int
    hit_rate: float | None
    last_report_at: dt.datetime | None
    attested: int = 0
    """Reports in the window that said what their boot still compiled."""
    at_floor: int = 0
    """Of those, the boots that compiled nothing (every count 0)."""
    still_compiled: dict[CompiledKind, int] = {}
    """What the other attested boots compiled, summed by kind."""
    variants: list[FleetVariant] = []
    """The key's engine variants pods reported in the window, most boots first."""
    missing: int = 0
    """Boots in the window that left out kinds of the run they installed as built on another
    image (other torch, Triton or TVM-FFI: no run of the key is current for theirs)."""
    missing_kinds: dict[ArtifactKind, int] = {}
    """Those boots by the kind they left out."""


class WantedTuning(BaseModel):
    """A key and environment pods asked for in the window and that still has no current
    tuning: from their ``miss`` reports. ``sources``: distinct sources that asked (client
    addresses, or token names where a token was presented: one address cannot pass for a
    fleet); ``pods``: distinct pod names that asked;
    ``reports``: miss reports; ``last_asked_at``: the latest; ``closest_run_id`` and
    ``differences``: the closest stored run and how it differs, as the latest report carried
    them; ``environment``: the pods' FlashInfer environment (when the report sent it)."""

    key: TuningKey
    environment_hash: str
    environment: EnvironmentMetadata | None
    sources: int = 0
    pods: int
    reports: int
    last_asked_at: dt.datetime
    closest_run_id: int | None
    differences: list[FieldDifference]


#: Keys (``limit``), and wanted tunings (``wanted_limit``), of a ``GET /v1/fleet`` page
#: when not given.
FLEET_PAGE_DEFAULT = 100
#: The most keys, and the most wanted tunings, one ``GET /v1/fleet`` page lists.
FLEET_PAGE_MAX = 1000
#: The longest window (``hours``) of a ``GET /v1/fleet`` page: ten years.
FLEET_MAX_HOURS = 24 * 3650


class FleetView(BaseModel):
    """Answer of ``GET /v1/fleet``: one page of the fleet matrix and one page of the wanted
    list over the last ``hours`` (from ``since``, by the pods' reports; ``generated_at``:
    the service's clock when it answered, which ``age_s`` counts from).

    * ``keys``: at most ``limit`` rows of the matrix (:class:`FleetKey`) from ``offset``
      (0-based) of ``total_keys`` in all; order: most reports in the window first, then
      ``model``, ``gpu_name``, ``max_num_batched_tokens``, key hash;
    * ``wanted``: at most ``wanted_limit`` tunings pods want (:class:`WantedTuning`) from
      ``wanted_offset`` of ``total_wanted`` in all; order: most distinct sources first, then
      most distinct pods, most reports, latest asked, key hash, environment hash.

    Both orders are total, so pages of one window do not overlap; counts move as reports
    arrive, so a page asked later may start at another key. A page past the end is empty.
    """

    hours: float
    since: dt.datetime
    generated_at: dt.datetime
    total_keys: int
    limit: int
    offset: int
    keys: list[FleetKey]
    total_wanted: int
    wanted_limit: int
    wanted_offset: int
    wanted: list[WantedTuning]
    wanted_variants: list[FleetVariant] = []
    """Engine variants pods found no warm state for in the window and that still have no
    current run: what ``tunecache retune --warmup vllm --engine-args`` would tune (most boots
    first, at most ``wanted_limit``)."""
    auto_tune_refused: dict[str, int] = {}
    """Automatic tunings refused in the window, by reason (:data:`AUTO_TUNE_REFUSALS`), every
    variant's: the sum of each :attr:`FleetVariant.auto_tune_refused`."""
