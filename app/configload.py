"""Loading the settings: the YAML file, the environment and flags, merged and validated once.

Precedence, lowest to highest: built-in defaults, the YAML file (``--config`` or
``FABRIC_DRA_CONFIG``), environment variables ``FABRIC_DRA_<SECTION>__<NAME>`` and command-line
flags (:func:`load_settings`). A bad value raises :class:`app.config.ConfigError` with one line
naming the setting, where the value came from, what is wrong and the expected form; the value
of an unknown or secret-looking setting is never shown. The model itself is :mod:`app.config`.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_settings import EnvSettingsSource

from app.config import (
    ENV_CONFIG_FILE,
    ENV_NOT_SETTINGS,
    ENV_NOT_SETTINGS_PREFIXES,
    ENV_PREFIX,
    NESTED_DELIMITER,
    ConfigError,
    Settings,
    redact_url,
)

_SECRET_WORDS = frozenset({"password", "passwd", "token", "secret", "key", "credential"})
"""Words that make a setting's name secret-looking: its value is never shown in an error."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader, refusing a key given twice in one mapping: PyYAML keeps the last
    one without a word (YAML 1.2 requires keys to be unique), so a second ``fabric:`` block
    would silently replace the first."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _value in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # "<<: *anchor": merged keys may be overridden
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:
                continue  # an unhashable key: the base constructor says so
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping",
                    node.start_mark,
                    f"found the key {key!r} twice",
                    key_node.start_mark,
                )
        return super().construct_mapping(node, deep=deep)


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"config file {str(path)!r}: cannot read it: {err.strerror}") from err
    except UnicodeDecodeError as err:
        raise ConfigError(f"config file {str(path)!r}: not UTF-8 text") from err
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader
    except RecursionError:
        raise ConfigError(
            f"config file {str(path)!r}: nested too deeply to read "
            f"(settings are at most {MAX_CONFIG_DEPTH} levels deep)"
        ) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None)
        # The parser's description of the problem, never the text around it (a secret
        # may stand there).
        what = f": {problem}" if isinstance(problem, str) and problem else ""
        raise ConfigError(f"config file {str(path)!r}: not valid YAML{where}{what}") from err
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file {str(path)!r}: expected a mapping of settings at the top level, "
            f"found {type(data).__name__}"
        )
    problem = _shape_problem(data)
    if problem is not None:
        raise ConfigError(f"config file {str(path)!r}: {problem}")
    return data


MAX_CONFIG_DEPTH = 16
"""The deepest nesting a config file may have (the settings themselves go 4 levels deep)."""


def _shape_problem(data: dict[Any, Any]) -> str | None:
    """What makes ``data`` (a config file's document) unusable before its settings are read,
    or None: a mapping key that is not text (YAML's ``1:``, ``null:`` or ``true:``; a setting
    name is text), or nesting deeper than :data:`MAX_CONFIG_DEPTH`. Walked without recursion,
    so any depth that PyYAML could read is reported, not a RecursionError."""
    stack: list[tuple[Any, tuple[str, ...]]] = [(data, ())]
    while stack:
        value, where = stack.pop()
        if len(where) > MAX_CONFIG_DEPTH:
            return f"nested more than {MAX_CONFIG_DEPTH} levels deep (at {_dotted(where[:3])}...)"
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    place = f" under {_dotted(where)}" if where else " at the top level"
                    # YAML's own spelling (1 == True in a dict look-up: compare by identity).
                    shown = (
                        "null"
                        if key is None
                        else str(key).lower()
                        if isinstance(key, bool)
                        else key
                    )
                    return f"key {shown}{place} is not a setting name (setting names are text)"
                stack.append((item, (*where, key)))
        elif isinstance(value, list):
            stack.extend((item, (*where, f"[{i}]")) for i, item in enumerate(value))
    return None


def _dotted(where: Sequence[str]) -> str:
    return ".".join(where).replace(".[", "[")


def _is_section(annotation: Any) -> bool:
    """Whether a top-level setting is a section (a model of settings of its own)."""
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _env_layer(environ: Mapping[str, str]) -> dict[str, Any]:
    """The settings given by ``FABRIC_DRA_*`` variables, nested; unknown names are errors."""
    known_sections = {name: info.annotation for name, info in Settings.model_fields.items()}
    for key in environ:
        upper = key.upper()
        if (
            not upper.startswith(ENV_PREFIX)
            or upper in ENV_NOT_SETTINGS
            or upper.startswith(ENV_NOT_SETTINGS_PREFIXES)
        ):
            continue
        head, _, tail = key[len(ENV_PREFIX) :].lower().partition(NESTED_DELIMITER)
        section = known_sections.get(head)
        unknown = section is None or (
            bool(tail)
            and not (
                isinstance(section, type)
                and issubclass(section, BaseModel)
                and tail in section.model_fields
            )
        )
        if unknown:
            close = _close_name((head, tail) if section is not None else (head,))
            if close is not None and section is None and tail:
                close = f"{close}.{tail}"
            mean = "" if close is None else f" (did you mean {_env_name(close.split('.'))}?)"
            sections = sorted(n for n, a in known_sections.items() if _is_section(a))
            names = sorted(n for n, a in known_sections.items() if not _is_section(a))
            raise ConfigError(
                f"environment variable {key}: no such setting{mean}; settings are "
                f"{ENV_PREFIX}<NAME> (names: {', '.join(names)}) or "
                f"{ENV_PREFIX}<SECTION>{NESTED_DELIMITER}<NAME> "
                f"(sections: {', '.join(sections)})"
            )
    source = EnvSettingsSource(
        Settings,
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=NESTED_DELIMITER,
        case_sensitive=False,
    )
    # EnvSettingsSource reads os.environ; an explicit mapping keeps tests independent.
    source.env_vars = {k.lower(): v for k, v in environ.items()}
    try:
        return dict(source())
    except Exception as err:  # pydantic-settings raises SettingsError for undecodable JSON
        field = re.search(r'field "(\w+)"', str(err))
        if field is not None:
            raise ConfigError(
                f"environment variable {ENV_PREFIX}{field.group(1).upper()}: not valid JSON; "
                f"expected {_describe((field.group(1),)) or 'a JSON value'}"
            ) from None
        raise ConfigError(f"environment: {err}") from err


def _deep_merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _deep_merge(dict(merged[key]), value)
        else:
            merged[key] = value
    return merged


def _shadowed_scalar(
    base: Mapping[str, Any], top: Mapping[str, Any], loc: tuple[str, ...] = ()
) -> tuple[tuple[str, ...], Any] | None:
    """The first place where ``base`` holds a value that is not a mapping (nor null) and
    ``top`` a section, with that value; None when there is none."""
    for key, value in top.items():
        if key not in base or not isinstance(value, Mapping):
            continue
        below = base[key]
        if isinstance(below, Mapping):
            found = _shadowed_scalar(below, value, (*loc, key))
            if found is not None:
                return found
        elif below is not None:
            return (*loc, key), below
    return None


def _lookup(layer: Mapping[str, Any], loc: tuple[int | str, ...]) -> bool:
    # A value found at a prefix of ``loc`` (a list given as one string) counts as given here.
    node: Any = layer
    for part in loc:
        if not isinstance(node, Mapping):
            return True
        if part not in node:
            return False
        node = node[part]
    return True


def _describe(loc: tuple[int | str, ...]) -> str:
    node: Any = Settings
    description = None
    for part in loc:
        if isinstance(part, int):
            continue
        fields = getattr(node, "model_fields", None)
        if not fields or part not in fields:
            return ""
        info = fields[part]
        node = info.annotation
        description = info.description
    return description or ""


def _looks_secret(loc: tuple[int | str, ...]) -> bool:
    """Whether a setting's name suggests a secret (its value is then never shown)."""
    words = {w for part in loc if isinstance(part, str) for w in part.lower().split("_")}
    return bool(words & _SECRET_WORDS)


def _close_name(loc: tuple[int | str, ...]) -> str | None:
    """The known setting closest to the unknown ``loc`` (``fabric.password_file`` for
    ``fabric.password``), by :func:`difflib.get_close_matches` over its section's fields."""
    node: Any = Settings
    for part in loc[:-1]:
        fields = getattr(node, "model_fields", None)
        if isinstance(part, int) or not fields or part not in fields:
            return None
        node = fields[part].annotation
    fields = getattr(node, "model_fields", None)
    if not fields or not isinstance(loc[-1], str):
        return None
    matches = difflib.get_close_matches(loc[-1], list(fields), n=1, cutoff=0.6)
    return ".".join([*map(str, loc[:-1]), matches[0]]) if matches else None


# What a setting's name looks like (pydantic field names), to tell a typo from foreign text.
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")


def _suggest(loc: tuple[int | str, ...]) -> str:
    """``; did you mean fabric.password_file?`` for an unknown setting, or nothing."""
    close = _close_name(loc)
    return "" if close is None else f"; did you mean {close}?"


def _env_name(
    loc: Sequence[int | str], layer: Mapping[str, Any] | None = None, message: str = ""
) -> str:
    """The environment variable that gave the value at ``loc``: a list setting is one
    variable (``FABRIC_DRA_FABRICS``, JSON, even when the JSON is an object), and a whole
    section is named by the variable of the setting ``message`` names, else by the first of
    its variables that ``layer`` (the environment's settings) holds."""
    parts: list[str] = []
    for part in loc:
        if not isinstance(part, str):
            break  # an index into a list given as one JSON variable
        parts.append(part)
    field = Settings.model_fields.get(parts[0]) if parts else None
    section = field is not None and _is_section(field.annotation)
    if (
        len(parts) == 1
        and section
        and layer is not None
        and isinstance(layer.get(parts[0]), Mapping)
    ):
        keys = [k for k in layer[parts[0]] if isinstance(k, str)]
        named = [k for k in keys if f"{parts[0]}.{k}" in message]
        if named or keys:
            parts.append((named or keys)[0])
    return ENV_PREFIX + NESTED_DELIMITER.join(parts).upper()


def _setting_name(loc: Sequence[int | str]) -> str:
    """``fabrics[0].name`` for the location ``("fabrics", 0, "name")``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def load_settings(
    config_file: Path | None = None,
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Read, merge and validate the settings.

    Args:
        config_file: a YAML file; when None, ``FABRIC_DRA_CONFIG`` from ``environ`` names it,
            and with neither there is no file layer.
        flags: values from the command line as a nested mapping (``{"fabric": {"url": ...}}``);
            None values are ignored, so unset flags do not override.
        environ: the environment; defaults to ``os.environ``.

    Returns:
        The frozen :class:`Settings`.

    Raises:
        ConfigError: one line per the first invalid setting, e.g.
            ``setting fabric.url (from environment FABRIC_DRA_FABRIC__URL): value 'ftp://x' is
            not an http:// or https:// URL; expected the fabric manager's base URL, e.g. ...``.
    """
    environ = os.environ if environ is None else environ
    if config_file is None and environ.get(ENV_CONFIG_FILE):
        config_file = Path(environ[ENV_CONFIG_FILE])
    file_layer = _read_yaml(config_file) if config_file is not None else {}
    env_layer = _env_layer(environ)
    flag_layer = _drop_none(flags or {})
    shadowed = _shadowed_scalar(file_layer, _deep_merge(env_layer, flag_layer))
    if shadowed is not None:
        # The merge would replace it with the environment's or the flags' section: say so
        # rather than drop the file's mistake without a word.
        where, value = shadowed
        shown = redact_url(value) if isinstance(value, str) else value
        raise ConfigError(
            f"setting {_setting_name(where)} (from {config_file}): value "
            f"{shown!r} is not a section; expected a mapping of settings"
        )
    merged = _deep_merge(_deep_merge(file_layer, env_layer), flag_layer)
    try:
        return Settings(**merged)
    except ValidationError as err:
        first = err.errors()[0]
        whole_model = not first["loc"]
        loc = tuple(first["loc"]) or _named_in(str(first["msg"]))
        name = _setting_name(loc) or "(settings)"
        if _lookup(flag_layer, loc):
            source = "from the command line"
        elif _lookup(env_layer, loc):
            source = f"from environment {_env_name(loc, env_layer, str(first['msg']))}"
        elif _lookup(file_layer, loc):
            source = f"from {config_file}"
        else:
            source = "default"
        more = f" (and {len(err.errors()) - 1} more problems)" if len(err.errors()) > 1 else ""
        if first["type"] == "extra_forbidden":
            # Never echo the value of an unknown setting: it may well be a secret.
            if not all(isinstance(p, int) or _KEY.fullmatch(p) for p in loc):
                # Not a setting's name at all (a line of some other file given as the config,
                # say): its text may be a secret, so it is not echoed either.
                raise ConfigError(
                    f"unknown setting: a key that is no setting's name ({source}); is this "
                    f"the right config file?{more}"
                ) from None
            raise ConfigError(f"unknown setting {name} ({source}){_suggest(loc)}{more}") from None
        problem = str(first["msg"]).removeprefix("Value error, ")
        value = first.get("input")
        if isinstance(value, str):
            value = redact_url(value)
        problem = problem[:1].lower() + problem[1:]
        # pydantic's word for the list settings' type (a tuple, to stay immutable).
        problem = problem.replace("a valid tuple", "a list")
        if first["type"] == "missing" or isinstance(value, Mapping) or _looks_secret(loc):
            shown = ""
        elif problem.startswith("input "):
            shown = f"value {value!r}: "
        else:
            shown = f"value {value!r} "
        # An error of the whole model says what is expected itself.
        expected = "" if whole_model else _describe(loc)
        hint = f"; expected {expected}" if expected else ""
        raise ConfigError(f"setting {name} ({source}): {shown}{problem}{hint}{more}") from None


def _named_in(message: str) -> tuple[str, ...]:
    """For an error of the whole model (no location): the top-level setting its message names
    first (``fabrics`` in "fabrics[a].password_file is set ..."), so that the error can say
    where that value came from; () when it names none."""
    found = [
        (match.start(), name)
        for name in Settings.model_fields
        if (match := re.search(rf"(?<![\w.]){re.escape(name)}(?![\w])", message)) is not None
    ]
    return (min(found)[1],) if found else ()


def _drop_none(values: Mapping[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, Mapping):
            nested = _drop_none(value)
            if nested:
                result[key] = nested
        elif value is not None:
            result[key] = value
    return result
