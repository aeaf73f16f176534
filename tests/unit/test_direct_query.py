"""Statements compiled for asyncpg (app.db.direct.DirectQuery) and asyncpg's errors as
SQLAlchemy's (translate): no server needed."""

from __future__ import annotations

import datetime as dt
from typing import Any

import asyncpg
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import Integer, String, bindparam, column, exc, select, update
from sqlalchemy.dialects import postgresql, sqlite

from app.db.direct import DirectQuery, translate
from app.db.models import Reservation, UtcDateTime
from app.journal import _FOR_CLAIM_ACTIVE, _move_one_statement, _reserve_free_statement

PG = postgresql.asyncpg.dialect()  # type: ignore[attr-defined]
_R = Reservation.__table__.c  # type: ignore[attr-defined]
TZ = dt.timezone(dt.timedelta(hours=2))


def test_parameters_are_numbered_in_the_order_of_their_names() -> None:
    statement = (
        update(Reservation.__table__)
        .where(_R.id == bindparam("b_id"))
        .values(state=bindparam("b_state"), updated_at=bindparam("b_now", type_=UtcDateTime()))
        .returning(_R.id, _R.updated_at)
    )
    query = DirectQuery.compile(statement, PG)
    assert query.names == ("b_state", "b_now", "b_id")
    assert "$1" in query.sql and "$3" in query.sql and "$4" not in query.sql
    now = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=TZ)
    arguments = query.arguments({"b_id": 7, "b_state": "attached", "b_now": now})
    # UtcDateTime's bind processor: the same instant, in UTC.
    assert arguments == ["attached", now.astimezone(dt.UTC), 7]
    assert arguments[1].tzinfo == dt.UTC


def test_values_the_statement_gives_itself_are_sent_without_being_asked_for() -> None:
    statement = select(_R.id).where(_R.claim_uid == "u-1", _R.attempts > 3)
    query = DirectQuery.compile(statement, PG)
    assert query.arguments({}) == ["u-1", 3]
    # A value given at the call wins over the statement's own.
    assert query.arguments({query.names[0]: "u-2"}) == ["u-2", 3]


def test_a_parameter_without_a_value_is_refused_before_anything_is_sent() -> None:
    query = DirectQuery.compile(_FOR_CLAIM_ACTIVE, PG)
    with pytest.raises(ValueError, match="no value for bound parameter 'b_uid'"):
        query.arguments({})


def test_a_naive_datetime_is_refused_as_sqlalchemy_refuses_it() -> None:
    statement = select(column("x")).where(column("t") == bindparam("b_t", type_=UtcDateTime()))
    query = DirectQuery.compile(statement, PG)
    with pytest.raises(ValueError, match="naive datetime"):
        query.arguments({"b_t": dt.datetime(2026, 1, 1)})


def test_result_columns_go_through_their_types_result_processors() -> None:
    query = DirectQuery.compile(select(_R.id, _R.updated_at, _R.state), PG)
    naive = dt.datetime(2026, 1, 1, 12)
    aware = dt.datetime(2026, 1, 1, 14, tzinfo=TZ)
    assert query.row((1, naive, "pending")) == (1, naive.replace(tzinfo=dt.UTC), "pending")
    assert query.row((2, aware, "attached")) == (2, aware.astimezone(dt.UTC), "attached")
    assert query.row((3, None, "released")) == (3, None, "released")
    plain = DirectQuery.compile(select(_R.id, _R.state), PG)
    assert plain.results == () and plain.row([4, "failed"]) == (4, "failed")


@pytest.mark.parametrize(
    "statement",
    [
        _FOR_CLAIM_ACTIVE,
        _reserve_free_statement(True),
        _reserve_free_statement(False),
        _move_one_statement(("attaching",), ("attaching", "attached"), "on", True, True),
        _move_one_statement(("detaching",), ("detaching",), "off", False, False),
    ],
)
def test_the_journal_statements_compile_to_the_sql_sqlalchemy_sends(statement: Any) -> None:
    query = DirectQuery.compile(statement, PG)
    compiled = statement.compile(dialect=PG)
    assert query.sql == compiled.string
    assert list(query.names) == list(compiled.positiontup)
    assert "POSTCOMPILE" not in query.sql
    # Every column's value comes back through the result processor of its type (the
    # reservation's four times are UtcDateTime).
    assert len(query.results) == 4


def test_an_expanding_parameter_is_refused() -> None:
    statement = select(_R.id).where(_R.state.in_(bindparam("b_states", expanding=True)))
    with pytest.raises(ValueError, match="expanding parameter"):
        DirectQuery.compile(statement, PG)


def test_a_dialect_that_does_not_number_parameters_is_refused() -> None:
    with pytest.raises(ValueError, match="does not number its parameters as"):
        DirectQuery.compile(_FOR_CLAIM_ACTIVE, sqlite.dialect())


def test_what_is_not_a_core_statement_is_refused() -> None:
    with pytest.raises(ValueError, match="not a Core statement"):
        DirectQuery.compile("SELECT 1", PG)  # type: ignore[arg-type]


@given(
    values=st.lists(
        st.one_of(st.none(), st.integers(), st.text(max_size=8)), min_size=1, max_size=8
    )
)
def test_each_value_goes_to_its_own_numbered_parameter(values: list[Any]) -> None:
    names = [f"b_{i}" for i in range(len(values))]
    statement = select(column("x")).where(
        *(
            column(f"c{i}") == bindparam(name, type_=Integer() if i % 2 else String())
            for i, name in enumerate(names)
        )
    )
    query = DirectQuery.compile(statement, PG)
    params = dict(zip(names, values, strict=True))
    arguments = query.arguments(params)
    for name, value in zip(query.names, arguments, strict=True):
        assert value == params[name]
        assert f"${query.names.index(name) + 1}::" in query.sql


@pytest.mark.parametrize(
    ("error", "expected", "usable"),
    [
        (asyncpg.UniqueViolationError("duplicate key"), exc.IntegrityError, True),
        (asyncpg.ForeignKeyViolationError("missing row"), exc.IntegrityError, True),
        (asyncpg.NotNullViolationError("null value"), exc.IntegrityError, True),
        (asyncpg.InvalidTextRepresentationError("bad int"), exc.DataError, True),
        (asyncpg.PostgresSyntaxError("syntax"), exc.ProgrammingError, True),
        (asyncpg.UndefinedTableError("no table"), exc.ProgrammingError, True),
        (asyncpg.QueryCanceledError("statement timeout"), exc.DatabaseError, True),
        (asyncpg.AdminShutdownError("terminating connection"), exc.OperationalError, False),
        (asyncpg.ConnectionDoesNotExistError("closed"), exc.OperationalError, False),
        (asyncpg.InterfaceError("another operation in progress"), exc.OperationalError, False),
        (ConnectionResetError(104, "reset"), exc.OperationalError, False),
        (TimeoutError(), exc.OperationalError, False),
    ],
)
def test_asyncpg_errors_become_sqlalchemys(
    error: Exception, expected: type[exc.DBAPIError], usable: bool
) -> None:
    translated, still_usable = translate(error, "SELECT $1", [1])
    assert type(translated) is expected
    assert translated.orig is error
    assert translated.statement == "SELECT $1" and translated.params == [1]
    assert still_usable is usable
    assert translated.connection_invalidated is not usable
