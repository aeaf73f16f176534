"""Build the configured fabric backends from settings (reads credential files)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.config import ConfigError, FabricSettings, read_secret
from app.fabric.backend import FabricBackend
from app.fabric.fleet import FabricFleet

if TYPE_CHECKING:
    from app.config import Settings


def backend_from_settings(fabric: FabricSettings, setting: str = "fabric") -> FabricBackend:
    """The backend that ``fabric`` describes, with its credentials read from their files.

    Args:
        fabric: one fabric manager's settings.
        setting: how errors name these settings (``fabric`` or ``fabrics[hall-a]``).

    Raises:
        ConfigError: ``fabric.url`` is not set, a credential file is missing or unreadable,
            credentials are missing for the auth mode, or the CA bundle cannot be used.
    """
    if fabric.url is None:
        env = (
            " (FABRIC_DRA_FABRIC__URL or --fabric-url)"
            if setting == "fabric"
            else " (each entry of fabrics needs a url)"
        )
        raise ConfigError(
            f"setting {setting}.url is not set; expected the fabric manager's origin, "
            f"e.g. https://fm.example:443{env}"
        )
    if fabric.kind == "cdim":
        return _cdim(fabric, fabric.url, setting)
    username = password = None
    if fabric.auth != "none":
        if fabric.username_file is None or fabric.password_file is None:
            raise ConfigError(
                f"settings {setting}.username_file and {setting}.password_file are needed "
                f"for {setting}.auth={fabric.auth}; expected paths of files holding them"
            )
        username = read_secret(fabric.username_file, f"{setting}.username_file")
        password = read_secret(fabric.password_file, f"{setting}.password_file")
    from app.fabric.redfish.backend import RedfishBackend
    from app.fabric.redfish.transport import RetrySettings

    try:
        return RedfishBackend(
            fabric.url,
            username=None if username is None else username.get_secret_value(),
            password=None if password is None else password.get_secret_value(),
            auth=fabric.auth,
            verify_tls=fabric.tls_verify,
            ca_file=fabric.ca_bundle,
            timeout_s=fabric.timeout_seconds,
            max_concurrency=fabric.concurrency,
            retry=RetrySettings(attempts=fabric.retry_attempts),
            task_timeout_s=fabric.task_timeout_seconds,
            server_owned_blocks=fabric.server_owned_blocks,
            verify_poll_s=fabric.verify_poll_seconds,
            verify_timeout_s=fabric.verify_timeout_seconds,
            device_identity=fabric.device_identity,
            name=fabric.manager,
        )
    except ValueError as err:
        raise ConfigError(f"settings {setting}: {err}") from err


def _cdim(fabric: FabricSettings, url: str, setting: str) -> FabricBackend:
    """A NEC CDIM backend (app.fabric.cdim); its token, when set, is read from its file."""
    from app.fabric.cdim import CdimBackend

    token = (
        read_secret(fabric.token_file, f"{setting}.token_file").get_secret_value()
        if fabric.token_file is not None
        else None
    )
    try:
        return CdimBackend(
            url,
            name=fabric.manager,
            prefix=fabric.path_prefix,
            token=token,
            procedure_fields=fabric.procedure_fields,
            verify_tls=fabric.tls_verify,
            ca_file=fabric.ca_bundle,
            timeout_s=fabric.timeout_seconds,
            poll_s=fabric.verify_poll_seconds,
            apply_timeout_s=fabric.task_timeout_seconds,
            busy_timeout_s=fabric.busy_timeout_seconds,
            batch_window_s=fabric.batch_window_seconds,
            cache_lag_s=fabric.cache_lag_seconds,
        )
    except ValueError as err:
        raise ConfigError(f"settings {setting}: {err}") from err


def fleet_from_settings(settings: Settings) -> FabricFleet:
    """Every configured fabric manager (``fabrics``, or the one ``fabric``) as a fleet.

    Raises:
        ConfigError: as :func:`backend_from_settings`, for the first manager at fault.
    """
    return FabricFleet(
        {
            manager.manager: backend_from_settings(manager, settings.setting_of(manager))
            for manager in settings.managers
        }
    )
