"""What an answer of the tunecache server says: the detail of an error answer (its JSON
``detail``, else the start of its text) and the seconds a ``Retry-After`` asks for. Shared by
every API resource's client through :mod:`~tunecache.store.http.transport`."""

from __future__ import annotations

import datetime as dt
import email.utils
import json
from typing import Any

import httpx


def retry_after_seconds(value: str | None, now: dt.datetime | None = None) -> float | None:
    """Seconds a ``Retry-After`` header asks for: delay-seconds or an HTTP date
    (RFC 9110, 10.2.3); ``None`` when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return max(0.0, (when - (now or dt.datetime.now(dt.timezone.utc))).total_seconds())


def json_object(response: httpx.Response) -> dict[str, Any] | None:
    """The body as a JSON object, or ``None`` (not JSON, or not an object)."""
    try:
        body = response.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def answer_detail(response: httpx.Response) -> Any:
    """What an error answer says: its JSON ``detail``, else the start of its text."""
    body = json_object(response)
    if body is not None and "detail" in body:
        return body["detail"]
    return response.text[:200] or response.reason_phrase


def body_detail(body: bytes) -> Any:
    """:func:`answer_detail` of a body read from a stream."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return body[:200].decode(errors="replace")
    return parsed.get("detail", parsed) if isinstance(parsed, dict) else parsed
