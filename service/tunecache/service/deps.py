"""Typed FastAPI dependencies (``SessionDep``, ``SettingsDep``).

``SessionDep`` is the request's transaction: one session in one transaction, committed
when the route returns and rolled back when it raises, before the response is sent
(``scope="function"``), so a client that gets an answer can rely on what it says being
stored. Routes and the storage modules never commit themselves.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from tunecache.service.settings import Settings
from tunecache.service.state import state_of


def request_transaction(request: Request) -> Iterator[Session]:
    """A session in a transaction: committed after the route returns, rolled back if it raises."""
    with state_of(request.app).sessions.begin() as session:
        yield session


def get_settings(request: Request) -> Settings:
    return state_of(request.app).settings


SessionDep = Annotated[Session, Depends(request_transaction, scope="function")]
SettingsDep = Annotated[Settings, Depends(get_settings)]
