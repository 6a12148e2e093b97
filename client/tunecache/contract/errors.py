"""The body of every error answer of the API."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class FieldError(BaseModel):
    """One invalid part of a request: where (``loc``, e.g. ``["body", "key", "arch"]``),
    why (``msg``, ``type``) and at most 100 characters of what was sent (``input``)."""

    loc: list[str | int]
    msg: str
    type: str
    input: Any = None
    ctx: dict[str, Any] | None = None


class ErrorBody(BaseModel):
    """The body of every error answer: ``detail`` is a message, or the list of invalid
    fields of a 422; ``missing`` lists the sha256 of artifacts a run refers to that were
    never uploaded."""

    detail: str | list[FieldError]
    missing: list[str] | None = None
