"""The PostgreSQL schema's text names nothing a tenant could put first on a search path.

The attacks themselves run on a real server (tests/integration/test_postgres_tenants.py);
this keeps a later edit of the text from adding an unqualified call or table, which the
pinned `search_path` would still resolve safely but the review asked to be exact.
"""

from __future__ import annotations

import re

import pytest

from cronlock_sidecar.stores import pgstore

# SQL syntax that looks like a call and is none (no search path is consulted), and the
# keywords the pattern below meets before a parenthesis.
SYNTAX = {"coalesce", "greatest", "least", "extract", "exists"}
KEYWORDS = {"and", "or", "not", "if", "elsif", "values", "from", "conflict", "f"}
# What follows FROM/INTO/UPDATE and is no relation: `RETURNING value INTO fence`,
# `SELECT * INTO mine` (variables), `extract(epoch FROM now - ...)`, `DO UPDATE SET`.
# `SELECT * INTO was FROM cronlock.permit_entry(...)`, `INTO written` (variables).
NOT_RELATIONS = {"fence", "mine", "theirs", "now", "SET", "CONFLICT", "was", "written"}
FUNCTIONS = [
    "cronlock.keep_fences",
    "cronlock.keep_rules",
    "cronlock.permit_count",
    "cronlock.permit_entry",
    "cronlock.tick_record",
]
# The functions that make no interval or timestamp of a number (so pass none as an
# integer that a planted overload could match better).
NO_NUMBERS_TO_TIMES = {"cronlock.keep_fences", "cronlock.permit_count", "cronlock.permit_entry"}
CALL = re.compile(r'(?<![\w."$])([A-Za-z_]\w*)\s*\(')
RELATION = re.compile(r"\b(?:FROM|INTO|UPDATE|TABLE|ON|FUNCTION)\s+([\w.]+)")


def code(text: str) -> str:
    """`text` without its string literals and comments."""
    return re.sub(r"--[^\n]*", "", re.sub(r"'(?:[^']|'')*'", "''", text))


def functions() -> dict[str, str]:
    bodies = re.findall(
        r"CREATE OR REPLACE FUNCTION (cronlock\.\w+)\([^)]*\)(.*?)\$(\w+)\$(.*?)\$\3\$;",
        pgstore.SCHEMA,
        re.S,
    )
    return {name: head + body for name, head, _, body in bodies}


def test_every_function_is_there_with_a_pinned_search_path() -> None:
    found = functions()
    assert sorted(found) == FUNCTIONS
    for name, text in found.items():
        assert "SET search_path = pg_catalog, pg_temp AS" in text, name


@pytest.mark.parametrize("name", FUNCTIONS)
def test_every_call_and_relation_in_a_function_is_qualified(name: str) -> None:
    text = code(functions()[name])
    calls = {call for call in CALL.findall(text) if call.lower() not in SYNTAX | KEYWORDS}
    assert calls == set()
    relations = set(RELATION.findall(text)) - NOT_RELATIONS
    assert relations <= {
        "cronlock.locks",
        "cronlock.fences",
        "cronlock.tick_record",
        "cronlock.permit_entry",
    }, relations
    assert "make_interval(" not in text.replace("pg_catalog.make_interval(", "")
    assert "::double precision" in text or name in NO_NUMBERS_TO_TIMES


@pytest.mark.parametrize("statement", ["_GET", "_CREATE", "_REPLACE", "_EXISTS"])
def test_the_sidecars_statements_name_the_schema(statement: str) -> None:
    text = code(getattr(pgstore, statement))
    assert "cronlock.locks" in text
    assert "cronlock_locks" not in text
    calls = {call for call in CALL.findall(text) if call.lower() not in SYNTAX | KEYWORDS}
    assert calls <= {"l"}, calls  # `cronlock.locks AS l (columns)`, an alias
