"""Shared fixtures for the governed-agents tests."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

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
