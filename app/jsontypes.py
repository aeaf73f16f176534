"""The JSON shapes shared by the Kubernetes and Redfish sides: one definition for every module.

``JsonDict`` is a decoded JSON object (``json.loads`` of an API server's or a fabric manager's
answer, or a body about to be sent): string keys, values of any JSON type.
"""

from __future__ import annotations

from typing import Any, TypeAlias

JsonDict: TypeAlias = dict[str, Any]
"""A decoded JSON object."""
