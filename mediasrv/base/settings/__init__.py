"""The settings: declared once (``model``: every field, its MEDIASRV_* variable, its help),
parsed (``values``), checked at start-up (``checks``) and described to an operator (``help``);
``client`` holds what ``mediasrv upload`` reads. The modules import one another in that order
only, so ``load`` is the one place a checked ``Settings`` is made.
"""
from __future__ import annotations

import os
from collections.abc import Mapping

from mediasrv.base.settings.checks import CHECKS
from mediasrv.base.settings.help import unknown_names
from mediasrv.base.settings.model import Settings, SettingsError

__all__ = ["Settings", "SettingsError", "load", "unknown_settings", "validated"]


def validated(settings: Settings) -> Settings:
    """``settings`` when its ranges and combinations hold; SettingsError with a clear message
    (the first problem found) otherwise."""
    for check in CHECKS:
        problem = check(settings)
        if problem:
            raise SettingsError(problem)
    return settings


def load(environ: Mapping[str, str] | None = None, *, host: str | None = None, port: int | None = None) -> Settings:
    """The checked settings of ``environ`` (this process's environment by default);
    ``host``/``port`` (the command line's) win over MEDIASRV_HOST/MEDIASRV_PORT."""
    return validated(Settings.from_env(environ, host=host, port=port))


def unknown_settings(environ: Mapping[str, str] | None = None) -> list[str]:
    """A warning for each MEDIASRV_* variable nothing reads (a misspelt name is otherwise
    silently ignored), with the nearest known name when one is close."""
    return unknown_names(os.environ if environ is None else environ)
