"""Typed FastAPI dependencies (``SessionDep``, ``SettingsDep``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from tunecache.service.settings import Settings


def get_session(request: Request) -> Iterator[Session]:
    """One session per request; routes commit explicitly, anything uncommitted is rolled back."""
    with request.app.state.sessions() as session:
        yield session


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


SessionDep = Annotated[Session, Depends(get_session)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
