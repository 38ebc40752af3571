"""The records the server answers with, as frozen dataclasses (the interface's objects).

Built from JSON by name: fields the server adds later are ignored, so an older client keeps
working against a newer server.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

JsonObject = dict[str, Any]
T = TypeVar("T")


def fields_of(cls: type[T], data: JsonObject) -> T:
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class StoredFile:
    """A file record (the interface's File)."""

    id: str
    user_id: str
    file_id: str
    name: str | None = None
    content_type: str | None = None
    size: int | None = None
    public_url: str | None = None
    default_url: str | None = None
    default_download_url: str | None = None
    public_download_url: str | None = None
    created_at: str | None = None
    is_public: bool | None = None

    @classmethod
    def from_json(cls, data: JsonObject) -> StoredFile:
        return fields_of(cls, data)


@dataclass(frozen=True)
class FilePage:
    files: list[StoredFile]
    total: int
    page: int
    limit: int

    @classmethod
    def from_json(cls, data: JsonObject) -> FilePage:
        return cls([StoredFile.from_json(f) for f in data["files"]], data["total"], data["page"], data["limit"])


@dataclass(frozen=True)
class User:
    id: str
    email: str
    created_at: str | None = None
    updated_at: str | None = None


@dataclass(frozen=True)
class Session:
    access_token: str
    refresh_token: str
    expires_in: int
    expires_at: int
    token_type: str = "bearer"


@dataclass(frozen=True)
class Login:
    user: User
    session: Session

    @classmethod
    def from_json(cls, data: JsonObject) -> Login:
        return cls(fields_of(User, data["user"]), fields_of(Session, data["session"]))


@dataclass(frozen=True)
class ApiKey:
    """An API key; ``key`` (the secret) is set only in the answer to its creation."""

    id: str
    key_prefix: str
    name: str | None = None
    created_at: str | None = None
    last_used_at: str | None = None
    key: str | None = None


@dataclass(frozen=True)
class ApiKeyPage:
    api_keys: list[ApiKey]
    total: int
    page: int
    limit: int


@dataclass(frozen=True)
class BulkDeleteResult:
    deleted: int
    errors: list[JsonObject]
    """One {id, error} per id that could not be deleted."""


@dataclass(frozen=True)
class SignedUrl:
    url: str
    download_url: str
    expires_at: str


@dataclass(frozen=True)
class Downloaded:
    path: Path
    size: int
    content_type: str | None
