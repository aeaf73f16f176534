"""Secrets never leak, TLS is verified by default, and the admin token is compared in constant
time.

The service runs in process with distinctive credentials: the fabric password, the admin token
and (on PostgreSQL, whose trust authentication accepts any password) a database password.
Everything it emits is captured -- logs at DEBUG through caplog and through the JSON formatter,
``/metrics``, every admin API answer, the Events in the emulator, and the messages of induced
failures (a wrong fabric password, an unreachable database, a bad admin token) -- and none may
contain a secret.
"""

from __future__ import annotations

import io
import json
import logging
import shutil
import ssl
from pathlib import Path

import pytest
import trustme
from aiohttp import web
from reliability_driver import (
    ADMIN_TOKEN,
    FABRIC_PASSWORD,
    FABRIC_USER,
    Cluster,
    eventually,
    http,
)
from reliability_service import Running, start_service

import app.admin.pipeline as admin_pipeline
from app.configload import load_settings
from app.db.engine import Database, DatabaseUnavailable
from app.fabric.factory import backend_from_settings
from app.inventory import InventorySync
from app.logs import JsonFormatter
from app.service import Service
from fabric_dra_sim.redfish import InventorySpec, RedfishSimulator

DB_PASSWORD = "Db-Passw0rd-c0ffee-51"  # a test secret to look for
SECRETS = (FABRIC_PASSWORD, ADMIN_TOKEN, DB_PASSWORD)
READ_PATHS = [
    "/",
    "/healthz",
    "/readyz",
    "/metrics",
    "/api/v1/openapi.json",
    "/api/v1/status",
    "/api/v1/pools",
    "/api/v1/pools/us-east/rack-01",
    "/api/v1/devices",
    "/api/v1/reservations",
    "/api/v1/claims/default/c1",
]


def leaks(text: str) -> list[str]:
    """The secrets found in ``text``."""
    return [s for s in SECRETS if s in text]


@pytest.fixture
def json_log() -> io.StringIO:
    """Root-logger output through the JSON formatter, at DEBUG."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    yield stream
    root.removeHandler(handler)
    root.setLevel(old_level)


@pytest.mark.slow
async def test_no_secret_appears_in_logs_metrics_answers_events_or_errors(
    cluster: Cluster,
    database_url: str,
    caplog: pytest.LogCaptureFixture,
    json_log: io.StringIO,
) -> None:
    caplog.set_level(logging.DEBUG)
    # On PostgreSQL (trust authentication: any password is accepted) the URL carries one.
    with_password = database_url.replace("postgres@", f"postgres:{DB_PASSWORD}@", 1)
    assert (DB_PASSWORD in with_password) == database_url.startswith("postgresql")
    running = await start_service(
        cluster,
        with_password,
        FABRIC_DRA_LEADER__ENABLED="false",
        FABRIC_DRA_DATABASE__MIGRATE_ON_START="false",
        FABRIC_DRA_LOG__LEVEL="DEBUG",
    )
    emitted: list[str] = []
    try:
        device = running.published_devices()[0]
        running.allocate("c1", device)
        await eventually(
            lambda: running.condition("c1", "FabricDeviceReady") == "True", what="c1 ready"
        )
        for path in READ_PATHS:
            status, text = await http("GET", running.base + path)
            assert status in (200, 404), (path, status, text)
            emitted.append(f"GET {path}: {text}")
        # A bad admin token, and none.
        for token in ("wrong-" + ADMIN_TOKEN[:4], None):
            status, text = await http(
                "POST", running.base + "/api/v1/reservations/1/release", token=token
            )
            assert status in (401, 403)
            emitted.append(text)
        # The fabric manager changes its password: every later call is refused.
        cluster.sim.password = "a-new-password"
        cluster.sim.expire_sessions()
        await eventually(lambda: _stale(running), timeout_s=20, what="sync fails on 401")
        status, text = await http("GET", running.base + "/api/v1/status")
        emitted.append(text)
        assert "401" in text or "auth" in text.lower(), text
        emitted.append(str(await running.service.status()))
        emitted.append(await running.metrics())
        emitted.append(str(running.service.last_inventory))
    finally:
        await running.service.stop(deadline_s=5)
    # An unreachable database: the error names the place, not the password.
    unreachable = f"postgresql+asyncpg://postgres:{DB_PASSWORD}@127.0.0.1:9/nowhere"
    service = Service(cluster.settings(unreachable, FABRIC_DRA_LEADER__ENABLED="false"))
    with pytest.raises(DatabaseUnavailable, match=r"127\.0\.0\.1") as failure:
        await service.start()
    await service.stop(deadline_s=2)
    emitted.append(f"{failure.value!r} {failure.value}")
    emitted.append(str(failure.value.__cause__))
    emitted += [json.dumps(e) for e in cluster.emu.list("v1", "Event", "default")]
    emitted += [json.dumps(c) for c in cluster.claims()]
    emitted.append(caplog.text)
    emitted += [f"{r.getMessage()} {r.exc_text or ''} {r.args!r}" for r in caplog.records]
    emitted.append(json_log.getvalue())
    assert json_log.getvalue(), "the JSON formatter saw nothing"
    assert any("DEBUG" in r.levelname for r in caplog.records)
    found = {secret for text in emitted for secret in leaks(text)}
    where = [text[:300] for text in emitted if leaks(text)]
    assert found == set(), f"secrets leaked: {found} in {where}"


async def _stale(running: Running) -> bool:
    return await running.metric("fabric_dra_inventory_stale", backend="redfish") == 1.0


async def test_the_admin_token_is_compared_with_hmac_compare_digest(
    running: Running,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = admin_pipeline.hmac.compare_digest

    def recording(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(admin_pipeline.hmac, "compare_digest", recording)
    status, _ = await http("POST", running.base + "/api/v1/reservations/1/release", token="nope")
    assert status == 403
    status, _ = await http(
        "POST", running.base + "/api/v1/reservations/1/release", token=ADMIN_TOKEN
    )
    assert status in (404, 409, 200)
    assert calls == [(b"nope", ADMIN_TOKEN.encode()), (ADMIN_TOKEN.encode(), ADMIN_TOKEN.encode())]


# ------------------------------------------------------------------------ TLS
async def _serve_https(sim: RedfishSimulator, context: ssl.SSLContext) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(sim.make_app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"https://localhost:{port}"


async def test_tls_is_verified_by_default_and_a_ca_bundle_makes_it_work(
    tmp_path: Path,
    sqlite_template: Path,
) -> None:
    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost", "127.0.0.1").configure_cert(server_context)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    sim = RedfishSimulator(
        spec=InventorySpec(regions=1, racks_per_region=1, devices_per_rack=2, hosts_per_rack=1),
        username=FABRIC_USER,
        password=FABRIC_PASSWORD,
        auth="session",
    )
    runner, url = await _serve_https(sim, server_context)
    (tmp_path / "user").write_text(FABRIC_USER)
    (tmp_path / "password").write_text(FABRIC_PASSWORD)
    db_path = tmp_path / "tls.db"
    shutil.copyfile(sqlite_template, db_path)
    database = Database.connect(f"sqlite+aiosqlite:///{db_path}")
    base = {
        "FABRIC_DRA_FABRIC__URL": url,
        "FABRIC_DRA_FABRIC__RETRY_ATTEMPTS": "1",
        "FABRIC_DRA_FABRIC__USERNAME_FILE": str(tmp_path / "user"),
        "FABRIC_DRA_FABRIC__PASSWORD_FILE": str(tmp_path / "password"),
    }
    try:
        settings = load_settings(environ=base)
        assert settings.fabric.tls_verify is True
        backend = backend_from_settings(settings.fabric)
        try:
            refused = await InventorySync(backend, database).sync_once()
        finally:
            await backend.close()
        assert not refused.ok
        assert refused.error is not None
        assert "certificate" in refused.error.lower() and "verif" in refused.error.lower(), (
            refused.error
        )
        assert not leaks(refused.error)

        trusted = load_settings(environ={**base, "FABRIC_DRA_FABRIC__CA_BUNDLE": str(ca_file)})
        backend = backend_from_settings(trusted.fabric)
        try:
            result = await InventorySync(backend, database).sync_once()
        finally:
            await backend.close()
        assert result.ok, result.error
        assert result.devices == 2
    finally:
        await database.dispose()
        await runner.cleanup()
