"""Shared fixtures: hypothesis profiles and the store URL fixture that runs one suite on both
databases."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, settings

# Hypothesis: `ci` is thorough, `dev` is fast. CARDFENCE_HYPOTHESIS picks one; CI=true means `ci`.
settings.register_profile(
    "ci",
    max_examples=500,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.register_profile(
    "dev",
    max_examples=60,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
_default_profile = "ci" if os.environ.get("CI") == "true" else "dev"
settings.load_profile(os.environ.get("CARDFENCE_HYPOTHESIS", _default_profile))

PG_URL_VAR = "CARDFENCE_TEST_PG_URL"


def postgres_admin_url() -> str:
    """The PostgreSQL server to test against; fails under CI, skips elsewhere, when absent."""
    url = os.environ.get(PG_URL_VAR)
    if url:
        return url
    reason = (
        f"PostgreSQL tests need {PG_URL_VAR} (scripts/test starts a throwaway cluster "
        "when pg_ctl is installed)"
    )
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}; under CI a missing PostgreSQL is a failure")
    pytest.skip(reason)


def fresh_postgres_schema(admin_url: str) -> tuple[str, str]:
    """A new empty schema on the test server and a URL whose connections use it."""
    schema = f"t_{uuid.uuid4().hex[:16]}"
    engine = sa.create_engine(admin_url.replace("postgresql://", "postgresql+psycopg://", 1))
    with engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE SCHEMA {schema}")
    engine.dispose()
    url = sa.make_url(admin_url).update_query_dict({"options": f"-csearch_path={schema}"})
    return schema, url.render_as_string(hide_password=False)


def drop_postgres_schema(admin_url: str, schema: str) -> None:
    engine = sa.create_engine(admin_url.replace("postgresql://", "postgresql+psycopg://", 1))
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DROP SCHEMA {schema} CASCADE")
    engine.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database: a SQLite file, or a fresh schema on the PostgreSQL test server."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'cardfence.db'}"
        return
    admin = postgres_admin_url()
    schema, url = fresh_postgres_schema(admin)
    try:
        yield url
    finally:
        drop_postgres_schema(admin, schema)


@pytest.fixture
def pg_admin_url() -> str:
    """The PostgreSQL test server's own URL (for what makes databases of its own)."""
    return postgres_admin_url()


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh schema on the PostgreSQL test server, for what only PostgreSQL can show."""
    admin = postgres_admin_url()
    schema, url = fresh_postgres_schema(admin)
    try:
        yield url
    finally:
        drop_postgres_schema(admin, schema)
