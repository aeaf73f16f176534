"""The admin API's OpenAPI document: it matches the router, and the running app keeps it.

Schemathesis generates requests from the served document (valid ones, and invalid ones that
must be refused with a 4xx), sends them over real HTTP to the app on 127.0.0.1, and checks
every answer: no 5xx, a documented status, content type, headers and body schema. Requests
carry the admin token so that the actions run too (against the seeded database).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
import requests
import schemathesis
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from test_admin import AUTH, Live, live_status, make_context, seed

from app.admin.app import make_app, routes, serve
from app.admin.pipeline import OPENAPI
from app.db.engine import Database

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
EXAMPLES = {GenerationMode.POSITIVE: 30, GenerationMode.NEGATIVE: 15}


def _router_table(app: web.Application) -> set[tuple[str, str]]:
    table = set()
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource else {}
        path = info.get("path") or info.get("formatter") or ""
        table.add((route.method, re.sub(r"\{(\w+)(?::[^{}]*)?\}", r"{\1}", path)))
    return table


async def test_the_document_names_exactly_the_routes_the_router_serves(db: Database) -> None:
    app = make_app(make_context(db, await seed(db), Live()))
    document = app[OPENAPI]
    documented = {
        (method.upper(), path)
        for path, operations in document["paths"].items()
        for method in operations
    }
    served = _router_table(app)
    # Every GET route answers HEAD too (RFC 9110 9.3.2), as OpenAPI documents leave implied.
    heads = {(m, path) for m, path in served if m == "HEAD"}
    assert heads == {("HEAD", path) for m, path in served if m == "GET"}
    served -= heads
    assert documented == served
    assert len(served) == len(routes())
    assert ("GET", "/api/v1/pools/{pool}") in served
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            assert "500" in operation["responses"], (method, path)
            if method == "post":
                assert {"413", "415"} <= set(operation["responses"]), path
            names = {p["name"] for p in operation.get("parameters", ()) if p["in"] == "path"}
            assert names == set(re.findall(r"\{(\w+)\}", path)), path
    refs = set(re.findall(r'"#/components/schemas/(\w+)"', str(document).replace("'", '"')))
    assert refs <= set(document["components"]["schemas"])


@pytest.fixture
async def served(db: Database) -> AsyncIterator[str]:
    """The admin app (seeded database, fake live parts) on 127.0.0.1, port chosen by the OS."""
    seeded = await seed(db)
    live = Live(status=live_status())
    runner = await serve(make_context(db, seeded, live), "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def _check(base_url: str, session: requests.Session, operation: Any, mode: GenerationMode) -> None:
    """Generate ``operation``'s cases in ``mode``, send each, run the checks on the answer."""
    checks = CHECKS + ([negative_data_rejection] if mode is GenerationMode.NEGATIVE else [])

    @settings(
        max_examples=EXAMPLES[mode],
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
    )
    @given(data=st.data())
    def run(data: Any) -> None:
        case = data.draw(operation.as_strategy(generation_mode=mode))
        response = case.call(base_url=base_url, session=session, headers=AUTH, timeout=10)
        case.validate_response(response, checks=checks, headers=AUTH)

    run()


def _fuzz(base_url: str) -> list[str]:
    """Run every operation in both generation modes; returns the failures found."""
    document = requests.get(f"{base_url}/api/v1/openapi.json", timeout=10).json()
    schema = schemathesis.openapi.from_dict(document)
    failures: list[str] = []
    session = requests.Session()
    try:
        for result in schema.get_all_operations():
            operation = result.ok()
            raw = document["paths"][operation.path][operation.method.lower()]
            for mode in EXAMPLES:
                if mode is GenerationMode.NEGATIVE and not (
                    raw.get("parameters") or raw.get("requestBody")
                ):
                    continue  # nothing to make invalid
                try:
                    _check(base_url, session, operation, mode)
                except Exception as err:
                    failures.append(f"{operation.label} ({mode.value}): {err}")
    finally:
        session.close()
    return failures


async def test_schemathesis_finds_no_server_error_and_answers_match_the_document(
    served: str,
) -> None:
    failures = await asyncio.to_thread(_fuzz, served)
    assert not failures, "\n\n".join(failures)
