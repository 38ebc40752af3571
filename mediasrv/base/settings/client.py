"""What the ``mediasrv upload`` client reads from the environment; the server's ``Settings``
are in ``mediasrv.base.settings``."""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass

from mediasrv.base.settings.model import SECRET, URL_WITH_PASSWORD, _env


@dataclass(frozen=True)
class ClientSettings:
    """What the ``mediasrv upload`` client reads from the environment (command-line options win).

    Kept apart from ``Settings``: a client needs none of the server's variables, and the
    server none of these.
    """

    api_key: str | None = _env("MEDIASRV_API_KEY", "API key for `mediasrv upload` (else --api-key)",
                               default=None, shown=SECRET)
    url: str | None = _env("MEDIASRV_URL", "server URL for `mediasrv upload` (else --url, default "
                           "http://127.0.0.1:8080)", default=None, shown=URL_WITH_PASSWORD)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ClientSettings:
        env = os.environ if environ is None else environ
        values = {f.name: env[f.metadata["env"]].strip() for f in dataclasses.fields(cls)
                  if env.get(f.metadata["env"], "").strip()}
        return cls(**values)

    @classmethod
    def help_text(cls) -> str:
        return "\n".join(f"  {f.metadata['env']:<32} {f.metadata['help']}" for f in dataclasses.fields(cls))
