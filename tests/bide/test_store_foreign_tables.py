"""A database that already holds a table of bide's names, made by another program.

Before: `open_store` accepted a foreign `bide_records(id, payload)`, created `bide_runs` beside it, and the
first run failed with "no such column: seq". Now the open is refused, naming the table, and creates nothing.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

import bide


@pytest.mark.parametrize("table", ["records", "runs"])
@pytest.mark.parametrize("create", [True, False])
def test_a_foreign_table_of_bides_name_is_refused_and_nothing_is_created(
    durable_store_spec: tuple[str, str], table: str, create: bool
) -> None:
    url, prefix = durable_store_spec
    if url.startswith("sqlite"):
        bide.open_store(url, table_prefix="other_").close()  # the file exists, without this prefix's tables
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"CREATE TABLE {prefix}{table} (id INTEGER, payload TEXT)")
        with pytest.raises(bide.StoreNotFound) as refused:
            bide.open_store(url, table_prefix=prefix, create=create)
        said = str(refused.value)
        if create:
            assert f"its table {prefix}{table} is not bide's" in said and "nothing was created" in said
        names = {n for n in sa.inspect(engine).get_table_names() if n.startswith(prefix)}
        assert names == {f"{prefix}{table}"}
        columns = {c["name"] for c in sa.inspect(engine).get_columns(f"{prefix}{table}")}
        assert columns == {"id", "payload"}
    finally:
        engine.dispose()


def test_a_store_made_by_bide_still_opens(durable_store_spec: tuple[str, str]) -> None:
    url, prefix = durable_store_spec
    bide.open_store(url, table_prefix=prefix).close()
    store = bide.open_store(url, table_prefix=prefix, create=False)
    try:
        store.insert_many("r", [("k", b"x")])
        assert [e.key for e in store.load("r")] == ["k"]
    finally:
        store.close()


def test_a_view_of_bides_name_is_refused_and_nothing_is_created(
    durable_store_spec: tuple[str, str],
) -> None:
    """A view with bide's columns passed the column check: bide created its runs table beside it, and the
    first run failed ("cannot modify ... because it is a view"); PostgreSQL lists materialized views apart."""
    url, prefix = durable_store_spec
    kinds = ["VIEW"]
    if url.startswith("sqlite"):
        bide.open_store(url, table_prefix="other_").close()
    else:
        kinds.append("MATERIALIZED VIEW")
    engine = sa.create_engine(url)
    try:
        for kind in kinds:
            with engine.begin() as conn:
                columns = "'r' AS run_id, 'k' AS key, 1 AS seq, 'x' AS data"
                conn.exec_driver_sql(f"CREATE {kind} {prefix}records AS SELECT {columns}")
            try:
                with pytest.raises(bide.StoreNotFound, match=f"{prefix}records is a view, not bide's table"):
                    bide.open_store(url, table_prefix=prefix)
                assert not sa.inspect(engine).has_table(f"{prefix}runs")
            finally:
                with engine.begin() as conn:
                    conn.exec_driver_sql(f"DROP {kind} IF EXISTS {prefix}records")
    finally:
        engine.dispose()
