"""Build the configured fabric backend from settings (reads credential files)."""

from __future__ import annotations

from app.config import ConfigError, FabricSettings, read_secret
from app.fabric.backend import FabricBackend


def backend_from_settings(fabric: FabricSettings) -> FabricBackend:
    """The backend that ``fabric`` describes, with its credentials read from their files.

    Raises:
        ConfigError: ``fabric.url`` is not set, a credential file is missing or unreadable,
            credentials are missing for the auth mode, or the CA bundle cannot be used.
    """
    if fabric.url is None:
        raise ConfigError(
            "setting fabric.url is not set; expected the fabric manager's origin, "
            "e.g. https://fm.example:443 (FABRIC_DRA_FABRIC__URL or --fabric-url)"
        )
    username = password = None
    if fabric.auth != "none":
        if fabric.username_file is None or fabric.password_file is None:
            raise ConfigError(
                f"settings fabric.username_file and fabric.password_file are needed for "
                f"fabric.auth={fabric.auth}; expected paths of files holding them"
            )
        username = read_secret(fabric.username_file, "fabric.username_file").get_secret_value()
        password = read_secret(fabric.password_file, "fabric.password_file").get_secret_value()
    from app.fabric.redfish.backend import RedfishBackend
    from app.fabric.redfish.transport import RetrySettings

    try:
        return RedfishBackend(
            fabric.url,
            username=username,
            password=password,
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
        )
    except ValueError as err:
        raise ConfigError(f"settings fabric: {err}") from err
