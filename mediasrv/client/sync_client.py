"""``SyncMediasrvClient``: the async client's API, blocking.

Each call runs the async client's method on a private event loop, so the two cannot drift
apart: a fix in ``MediasrvClient`` is a fix here.
"""
from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, TypeVar

import httpx

from mediasrv.client.async_client import DEFAULT_TIMEOUT, DEFAULT_URL, MediasrvClient
from mediasrv.client.models import (
    ApiKey,
    ApiKeyPage,
    BulkDeleteResult,
    Downloaded,
    FilePage,
    JsonObject,
    Login,
    SignedUrl,
    StoredFile,
    User,
)
from mediasrv.client.transfer import OCTET_STREAM, ProgressCallback

R = TypeVar("R")


class SyncMediasrvClient:
    """The same API, blocking: each call runs the async client's method on a private event loop.

    Not for use inside a running event loop (use ``MediasrvClient`` there).
    """

    def __init__(self, base_url: str = DEFAULT_URL, *, api_key: str | None = None, token: str | None = None,
                 timeout: httpx.Timeout | float = DEFAULT_TIMEOUT) -> None:
        self._runner = asyncio.Runner()
        self._async = MediasrvClient(base_url, api_key=api_key, token=token, timeout=timeout)

    def _run(self, coro: Coroutine[Any, Any, R]) -> R:
        return self._runner.run(coro)

    def __enter__(self) -> SyncMediasrvClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._run(self._async.aclose())
        self._runner.close()

    @property
    def token(self) -> str | None:
        return self._async.token

    def ping(self) -> bool:
        return self._run(self._async.ping())

    def register(self, email: str, password: str, redirect_to: str | None = None) -> User:
        return self._run(self._async.register(email, password, redirect_to))

    def confirm_email(self, token: str) -> str:
        return self._run(self._async.confirm_email(token))

    def login(self, email: str, password: str) -> Login:
        return self._run(self._async.login(email, password))

    def refresh(self, refresh_token: str) -> Login:
        return self._run(self._async.refresh(refresh_token))

    def logout(self, refresh_token: str) -> None:
        return self._run(self._async.logout(refresh_token))

    def forgot_password(self, email: str) -> None:
        return self._run(self._async.forgot_password(email))

    def reset_password(self, token: str, password: str) -> None:
        return self._run(self._async.reset_password(token, password))

    def create_api_key(self, name: str | None = None) -> ApiKey:
        return self._run(self._async.create_api_key(name))

    def list_api_keys(self, page: int = 1, limit: int = 30) -> ApiKeyPage:
        return self._run(self._async.list_api_keys(page, limit))

    def revoke_api_key(self, key_id: str) -> None:
        return self._run(self._async.revoke_api_key(key_id))

    def upload_file(self, path: str | os.PathLike[str], *, content_type: str | None = None, name: str | None = None,
                    is_public: bool = True, on_progress: ProgressCallback | None = None) -> StoredFile:
        return self._run(self._async.upload_file(path, content_type=content_type, name=name, is_public=is_public,
                                                 on_progress=on_progress))

    def upload_bytes(self, data: bytes, content_type: str = OCTET_STREAM, *,
                     name: str | None = None, is_public: bool = True) -> StoredFile:
        return self._run(self._async.upload_bytes(data, content_type, name=name, is_public=is_public))

    def list_files(self, **filters: Any) -> FilePage:
        """Same keyword filters as ``MediasrvClient.list_files``."""
        return self._run(self._async.list_files(**filters))

    def get_file(self, file_id: str) -> StoredFile:
        return self._run(self._async.get_file(file_id))

    def delete_file(self, file_id: str) -> None:
        return self._run(self._async.delete_file(file_id))

    def bulk_delete(self, file_ids: list[str]) -> BulkDeleteResult:
        return self._run(self._async.bulk_delete(file_ids))

    def signed_url(self, file_id: str, expires_in: int = 3600) -> SignedUrl:
        return self._run(self._async.signed_url(file_id, expires_in))

    def get_settings(self) -> JsonObject:
        return self._run(self._async.get_settings())

    def update_settings(self, **changes: Any) -> JsonObject:
        return self._run(self._async.update_settings(**changes))

    def usage(self) -> JsonObject:
        return self._run(self._async.usage())

    def daily_usage(self, days: int = 30) -> JsonObject:
        return self._run(self._async.daily_usage(days))

    def logs(self, page: int = 1, limit: int = 30) -> JsonObject:
        return self._run(self._async.logs(page, limit))

    def profile(self) -> JsonObject:
        return self._run(self._async.profile())

    def allowed_content_types(self) -> list[str]:
        return self._run(self._async.allowed_content_types())

    def download(self, file_id: str, dest: str | os.PathLike[str], *,
                 on_progress: ProgressCallback | None = None) -> Downloaded:
        return self._run(self._async.download(file_id, dest, on_progress=on_progress))

    def download_media(self, file_id: str, dest: str | os.PathLike[str], *, width: int | None = None,
                       height: int | None = None, fit: str | None = None, format: str | None = None,
                       quality: int | None = None, accept: str | None = None, transform_key: str | None = None,
                       on_progress: ProgressCallback | None = None) -> Downloaded:
        return self._run(self._async.download_media(
            file_id, dest, width=width, height=height, fit=fit, format=format, quality=quality, accept=accept,
            transform_key=transform_key, on_progress=on_progress))

    def media_url(self, file_id: str, *, width: int | None = None, height: int | None = None,
                  fit: str | None = None, format: str | None = None, quality: int | None = None,
                  transform_key: str | None = None) -> str:
        return self._async.media_url(file_id, width=width, height=height, fit=fit, format=format,
                                     quality=quality, transform_key=transform_key)
