"""The tuning history (``GET /v1/tunings``): its query (:class:`TuningRunQuery`), pages
and their cursors, and the CSV export of its runs."""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
from typing import Annotated, Any, Literal, Optional

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    create_model,
    field_validator,
    model_validator,
)

from tunecache.contract.identity import ENVIRONMENT_FIELDS, KEY_FIELDS, MAX_ID, NO_NUL, EnvironmentMetadata, TuningKey
from tunecache.contract.runs import RunStatus, RunTrigger, TuningRunRead


def encode_run_cursor(created_at: dt.datetime, run_id: int) -> str:
    """The opaque ``cursor`` of a history page that ends at the run ``(created_at, run_id)``:
    URL-safe base64 (no padding) of ``["<created_at ISO 8601, UTC>", run_id]``."""
    position = json.dumps([created_at.astimezone(dt.timezone.utc).isoformat(), run_id], separators=(",", ":"))
    return base64.urlsafe_b64encode(position.encode()).decode().rstrip("=")


def decode_run_cursor(cursor: str) -> tuple[dt.datetime, int]:
    """``(created_at, run_id)`` of a cursor made by :func:`encode_run_cursor`.

    Raises:
        ValueError: not a cursor this service gives out.
    """
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created_at, run_id = json.loads(raw)
        when = dt.datetime.fromisoformat(created_at)
    except (ValueError, TypeError, UnicodeDecodeError):
        raise ValueError("is not a cursor of this service (pass the next_cursor of a page as it is)") from None
    if when.tzinfo is None or isinstance(run_id, bool) or not isinstance(run_id, int) or not 0 < run_id <= MAX_ID:
        raise ValueError("is not a cursor of this service (pass the next_cursor of a page as it is)")
    return when, run_id


_ISO_DATE_TIME = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}")


def _iso_date_time(value: Any) -> Any:
    """ISO 8601 text (or a datetime) only: pydantic alone would also take ``0.5`` as a Unix time."""
    if isinstance(value, str) and not _ISO_DATE_TIME.match(value):
        raise ValueError("must be an ISO 8601 date-time with a time zone, e.g. 2026-12-01T08:00:00Z")
    if isinstance(value, (int, float)):
        raise ValueError("must be an ISO 8601 date-time with a time zone, e.g. 2026-12-01T08:00:00Z")
    return value


def _in_utc(value: dt.datetime) -> dt.datetime:
    """The time in UTC, as the service stores and compares times; one that falls outside
    the years 1-9999 there (``0001-01-01T00:00:00+05:00``) is refused."""
    try:
        return value.astimezone(dt.timezone.utc)
    except OverflowError:
        raise ValueError("is outside the years 1-9999 once in UTC") from None


#: A timezone-aware time given as ISO 8601 (``2026-12-01T08:00:00Z``), never as a number; in UTC.
IsoDateTime = Annotated[AwareDatetime, BeforeValidator(_iso_date_time), AfterValidator(_in_utc)]


def _filters_of(model: type[BaseModel]) -> dict[str, Any]:
    """One optional filter per field of ``model``, with the field's constraints, as a query
    string gives it: text without NUL (``pattern``), a plain integer."""
    filters: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        constraints = {attr: getattr(item, attr) for item in field.metadata
                       for attr in ("gt", "ge", "lt", "le", "min_length", "max_length", "pattern")
                       if getattr(item, attr, None) is not None}
        if field.annotation is str:
            constraints.setdefault("pattern", NO_NUL)
        filters[name] = (Optional[field.annotation], Field(default=None, **constraints))
    return filters


#: The history's filters on every key field (read from :class:`TuningKey`) and every
#: environment field (from :class:`EnvironmentMetadata`), in that order.
_RunFilters = create_model("_RunFilters", __module__=__name__, **_filters_of(TuningKey), **_filters_of(EnvironmentMetadata))


class TuningRunQuery(_RunFilters):
    """Filters and page of the tuning history (``GET /v1/tunings`` query parameters).

    Filters, all optional and combined (AND):

    * every key field (:data:`KEY_FIELDS`: ``gpu_name``, ``arch``, ``model``,
      ``max_num_batched_tokens``, ``dtype``, ``quantization``, the parallel sizes) and every
      environment field (:data:`ENVIRONMENT_FIELDS`: ``flashinfer_version``, ``cuda_version``,
      ..., ``gpu``), each equal to the value given;
    * ``status``, ``trigger``; ``current_only``: runs current for their key and environment;
    * ``since`` / ``until``: ``since <= created_at < until`` (ISO 8601 with a time zone).

    Order: newest first, by ``created_at`` then ``id``. Pages of ``limit`` (1-500) runs:
    ``cursor`` (the ``next_cursor`` of the page before; a page never shifts when runs are
    recorded meanwhile) or ``offset`` (kept for existing callers); not both.

    ``format``: ``json`` (a :class:`TuningRunPage`) or ``csv`` (every matching run, from
    ``cursor`` on, streamed as CSV with a header row; ``limit`` and ``offset`` do not
    apply); ``Accept: text/csv`` asks for CSV too.
    """

    model_config = ConfigDict(extra="forbid")

    status: RunStatus | None = None
    trigger: RunTrigger | None = None
    since: IsoDateTime | None = None
    until: IsoDateTime | None = None
    current_only: bool = False
    limit: int = Field(default=50, ge=1, le=500)
    offset: int = Field(default=0, ge=0, le=MAX_ID)
    cursor: str | None = Field(default=None, min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_-]+$",
                               description="next_cursor of the page before (opaque)")
    format: Literal["json", "csv"] = "json"

    @field_validator("cursor")
    @classmethod
    def _cursor_is_ours(cls, cursor: str | None) -> str | None:
        if cursor is not None:
            decode_run_cursor(cursor)
        return cursor

    @model_validator(mode="after")
    def _consistent(self) -> "TuningRunQuery":
        if self.since is not None and self.until is not None and self.until <= self.since:
            raise ValueError(f"until ({self.until.isoformat()}) must be later than since ({self.since.isoformat()})")
        if self.cursor is not None and self.offset:
            raise ValueError("offset and cursor cannot be combined: a cursor already says where the page starts")
        return self

    def filters(self) -> dict[str, Any]:
        """The key and environment fields this query filters on, ``{field: value}``."""
        return {f: getattr(self, f) for f in (*KEY_FIELDS, *ENVIRONMENT_FIELDS) if getattr(self, f) is not None}

    def position(self) -> tuple[dt.datetime, int] | None:
        """``(created_at, id)`` of the run the page starts after (from ``cursor``), or ``None``."""
        return decode_run_cursor(self.cursor) if self.cursor is not None else None


class TuningRunPage(BaseModel):
    """A page of ``GET /v1/tunings``, newest first (``created_at``, then ``id``).

    ``total``: runs matching the filters in all (not only from the cursor on).
    ``next_cursor``: pass it as ``cursor`` for the next page; ``None`` on the last page.
    """

    items: list[TuningRunRead]
    total: int
    limit: int
    offset: int
    next_cursor: str | None = None


#: The columns of the history's CSV export (``GET /v1/tunings?format=csv``), in order:
#: the run, its key, its environment, then what was recorded with it. Times are ISO 8601
#: (UTC); ``entries`` is the FlashInfer file's entry count; ``signing_key_id`` the key
#: that signed the run (empty: unsigned).
RUN_CSV_COLUMNS: tuple[str, ...] = (
    "id", "created_at", "status", "trigger", "verified", "is_current", *KEY_FIELDS, "environment_hash",
    *ENVIRONMENT_FIELDS, "node", "started_at", "finished_at", "duration_s", "entries", "recorded_by",
    "signing_key_id", "error",
)


#: What a spreadsheet takes a cell starting with for a formula (OWASP's list for CSV
#: injection): a text cell of the export that starts with one gets a leading ``'``.
CSV_FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")


def csv_text_cell(value: str) -> str:
    """``value`` as a CSV cell a spreadsheet shows as text: prefixed with ``'`` when it starts
    with one of :data:`CSV_FORMULA_PREFIXES` (a model named ``=HYPERLINK(...)`` would
    otherwise run as a formula where the export is opened)."""
    return "'" + value if value.startswith(CSV_FORMULA_PREFIXES) else value


def run_csv_row(run: TuningRunRead) -> list[str]:
    """The values of :data:`RUN_CSV_COLUMNS` for one run, as text (``""`` for none); text
    values through :func:`csv_text_cell`, numbers, times and booleans as they are."""

    def text(value: Any) -> str:
        if value is None:
            return ""
        if isinstance(value, dt.datetime):
            return value.astimezone(dt.timezone.utc).isoformat()
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, (int, float)):
            return str(value)
        return csv_text_cell(str(value))

    values = {
        "id": run.id, "created_at": run.created_at, "status": run.status, "trigger": run.trigger, "verified": run.verified,
        "is_current": run.is_current, **run.key.model_dump(), "environment_hash": run.environment_hash,
        **run.environment.model_dump(), "node": run.node, "started_at": run.started_at, "finished_at": run.finished_at,
        "duration_s": run.duration_s, "entries": run.entries, "recorded_by": run.recorded_by,
        "signing_key_id": run.signature.key_id if run.signature else None, "error": run.error,
    }
    return [text(values[column]) for column in RUN_CSV_COLUMNS]
