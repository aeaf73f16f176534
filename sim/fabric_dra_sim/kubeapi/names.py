"""Name and value format checks shared by the validation modules.

Ports of k8s.io/apimachinery pkg/util/validation (IsDNS1123Subdomain, IsDNS1123Label,
IsQualifiedName, IsValidLabelValue, IsCIdentifier) returning error messages instead of bools.
"""

from __future__ import annotations

import re

DNS1123_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN_RE = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
C_IDENTIFIER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
QUALIFIED_NAME_PART_RE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
# Semantic Versioning 2.0.0, the regular expression published at semver.org.
SEMVER_RE = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)
CAMEL_REASON_RE = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")


def dns_label(value: str) -> list[str]:
    """Errors for an RFC 1123 label (<= 63, lowercase alphanumerics and '-')."""
    errors: list[str] = []
    if len(value) > 63:
        errors.append("must be no more than 63 characters")
    if not DNS1123_LABEL_RE.match(value):
        errors.append(
            "a lowercase RFC 1123 label must consist of lower case alphanumeric "
            "characters or '-', and must start and end with an alphanumeric character"
        )
    return errors


def dns_subdomain(value: str, max_length: int = 253) -> list[str]:
    """Errors for an RFC 1123 subdomain of at most ``max_length`` characters."""
    errors: list[str] = []
    if len(value) > max_length:
        errors.append(f"must be no more than {max_length} characters")
    if not DNS1123_SUBDOMAIN_RE.match(value):
        errors.append(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
            "characters, '-' or '.', and must start and end with an alphanumeric "
            "character"
        )
    return errors


def qualified_name(value: str) -> list[str]:
    """Errors for a label-key style qualified name: ``[prefix/]name``, name <= 63."""
    prefix, slash, name = value.rpartition("/")
    errors: list[str] = []
    if slash and not prefix:
        errors.append("prefix part must be non-empty")
    elif prefix:
        errors.extend(f"prefix part {e}" for e in dns_subdomain(prefix))
    if not name:
        errors.append("name part must be non-empty")
    elif len(name) > 63:
        errors.append("name part must be no more than 63 characters")
    elif not QUALIFIED_NAME_PART_RE.match(name):
        errors.append(
            "name part must consist of alphanumeric characters, '-', '_' or '.', and "
            "must start and end with an alphanumeric character"
        )
    return errors


def label_value(value: str) -> list[str]:
    """Errors for a label value (<= 63, may be empty)."""
    errors: list[str] = []
    if len(value) > 63:
        errors.append("must be no more than 63 characters")
    if not LABEL_VALUE_RE.match(value):
        errors.append(
            "a valid label must be an empty string or consist of alphanumeric "
            "characters, '-', '_' or '.', and must start and end with an alphanumeric "
            "character"
        )
    return errors


def path_segment_name(value: str) -> list[str]:
    """Errors for a name that only has to be a valid URL path segment (Events)."""
    if value in (".", ".."):
        return [f"may not be '{value}'"]
    if "/" in value or "%" in value:
        return ["may not contain '/' or '%'"]
    return []
