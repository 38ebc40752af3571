"""How the settings are shown to an operator: ``mediasrv serve --help``'s list of variables
with readable defaults, a value as ``mediasrv config`` and the start-up log show it (secrets
masked, from the marks on the declarations), and a warning for each MEDIASRV_* name that
nothing reads."""
from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mediasrv.base.settings.client import ClientSettings
from mediasrv.base.settings.model import OTHER_NAMES, SECRET, URL_WITH_PASSWORD, Settings
from mediasrv.base.settings.values import MASK, masked_url, shown_bytes, shown_number, shown_seconds


def help_text(cls: type) -> str:
    """One line per variable of the settings class ``cls``, with its default, under headings."""
    lines = []
    for f in dataclasses.fields(cls):
        if f.name in _GROUPS:
            lines.append(_GROUPS[f.name])
        if "env" in f.metadata:
            text = f.metadata["help"]
            if "default" not in text and "unset" not in text:  # else the text says it in words
                text += f" (default {default_text(f)})"
            lines.append(f"  {f.metadata['env']:<32} {text}")
    return "\n".join(lines)


def shown_value(settings: object, name: str) -> str:
    """Field ``name`` of a settings object as an operator may see it: a secret as ``MASK``, the
    password of a URL masked, lists comma-separated, booleans as true/false, unset as empty."""
    f = _field(type(settings), name)
    value = getattr(settings, name)
    if value is None:
        return ""
    kind = f.metadata.get("shown")
    if kind == SECRET:
        return MASK
    if kind == URL_WITH_PASSWORD:
        return masked_url(str(value))
    if name == "rate_limits":
        return ", ".join(f"{key}={per_minute}" for key, per_minute in value)
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def secret_names(cls: type) -> list[str]:
    """The variables of settings class ``cls`` that are never shown in clear (a secret, or a
    URL's password)."""
    return [f.metadata["env"] for f in dataclasses.fields(cls) if f.metadata.get("shown")]


def _field(cls: type, name: str) -> dataclasses.Field[Any]:
    for f in dataclasses.fields(cls):
        if f.name == name:
            return f
    raise KeyError(name)


def unknown_names(env: Mapping[str, str]) -> list[str]:
    """The warnings of ``Settings.unknown_names``: server and client settings are both known."""
    known = {f.metadata["env"] for c in (Settings, ClientSettings) for f in dataclasses.fields(c)
             if "env" in f.metadata} | OTHER_NAMES
    warnings = []
    for name in sorted(env):
        if not name.startswith("MEDIASRV_") or name in known or name.startswith("MEDIASRV_TEST_"):
            continue
        near = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.75)
        hint = f" (did you mean {near[0]}?)" if near else ""
        warnings.append(f"{name} is not a mediasrv setting and is ignored{hint}; "
                        "`mediasrv serve --help` lists them")
    return warnings


_GROUPS = {"host": " listener and data:",
           "mongodb_url": " MongoDB metadata (default: SQLite in DATA_DIR):",
           "s3_bucket": " S3 blobs (default: files in DATA_DIR):",
           "public_url": " server:"}
"""Headings of ``help_text``, printed before the named field."""


def default_text(f: dataclasses.Field[Any]) -> str:
    """A field's default as an operator would write it in the environment, readably: sizes
    in KiB/MiB/GiB (which the size settings accept), long durations with their meaning."""
    value = f.default
    if value is None:
        return "unset"
    if value == "":
        return "empty"
    if isinstance(value, bool):
        return "true" if value else "false"
    if f.name.endswith("_bytes") and isinstance(value, int):
        return shown_bytes(value)
    if f.name.endswith("_s") and isinstance(value, (int, float)):
        return shown_seconds(value)
    if isinstance(value, float):
        return shown_number(value)
    if isinstance(value, Path) and not value.is_absolute():
        return f"./{value}"
    if isinstance(value, tuple):
        if not value:
            return "none"
        text = ",".join(map(str, value))
        return text if len(text) <= 60 else "built-in list, see `mediasrv config`"
    return str(value)
