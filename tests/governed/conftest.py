"""Shared fixtures for the governed-agents tests."""

from __future__ import annotations

import contextlib
import functools
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from govern.runtime._eventlog import EventLog

POSTGRES_URL = os.environ.get("BIDE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def log_url(request: pytest.FixtureRequest, tmp_path: object) -> Iterator[str]:
    """A durable event log URL many processes can share: a fresh SQLite file, or the test PostgreSQL."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/events.db"
    else:
        yield POSTGRES_URL


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def any_log_url(request: pytest.FixtureRequest, tmp_path: object) -> Iterator[str]:
    """Every backend the event log contract must hold on: memory, a SQLite file, PostgreSQL."""
    if request.param == "memory":
        yield "memory://"
    elif request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/events.db"
    else:
        yield POSTGRES_URL


@pytest.fixture
def log_name() -> str:
    """A log name no other test uses (PostgreSQL tables are shared between tests and runs)."""
    return f"log-{uuid.uuid4().hex[:12]}"


@pytest.fixture(autouse=True)
def _logs_closed(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every `EventLog` a test opens in this process is closed when the test ends. A handle left open
    keeps its pooled PostgreSQL sessions until the garbage collector's next full pass (its pool lives on
    in a reference cycle): tests running side by side then ran the server out of its 100 connections,
    and others failed with "too many clients"."""
    opened: list[EventLog] = []  # (held: a dropped handle's pool lives on in a reference cycle)
    init = EventLog.__init__

    @functools.wraps(init)
    def tracked(self: EventLog, *args: Any, **options: Any) -> None:
        init(self, *args, **options)
        opened.append(self)

    monkeypatch.setattr(EventLog, "__init__", tracked)
    yield
    for log in opened:
        with contextlib.suppress(Exception):  # (a test may have broken it on purpose)
            log.close()
