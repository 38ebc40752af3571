"""The small core services the account routes call: API keys, own settings, usage, health."""
from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from mediasrv.base.errors import BadRequest, NotFound
from mediasrv.base.settings import Settings
from mediasrv.base.timeutil import period_key
from mediasrv.core.account_info import AccountInfo
from mediasrv.core.account_settings import AccountSettings
from mediasrv.core.credentials.apikeys import MAX_NAME_CHARS, ApiKeyService, looks_like_key
from mediasrv.core.credentials.tokens import digest
from mediasrv.core.domains.custom import DomainService
from mediasrv.core.domains.providers import ManualProvider
from mediasrv.core.health import HealthCheck
from store.models import UsageCounts
from tests.core.conftest import Local

CAP = 10_000


async def test_api_keys_are_shown_once_and_revoked_only_by_their_owner(local: Local) -> None:
    owner = await local.user("u1")
    await local.user("u2")
    keys = ApiKeyService(local.meta)
    created = await keys.create(owner, "ci")
    assert looks_like_key(created["key"]) and created["key"].startswith(created["key_prefix"])
    stored = await local.meta.get_api_key_by_hash(digest(created["key"]))
    assert stored is not None and stored.user_id == "u1"  # only the digest is kept
    listed, total = await keys.list("u1", 0, 10)
    assert total == 1 and "key" not in listed[0] and listed[0]["id"] == created["id"]
    assert await keys.list("u2", 0, 10) == ([], 0)
    for user_id, key_id in (("u2", created["id"]), ("u1", "not-a-uuid"), ("u1", str(uuid.uuid4()))):
        with pytest.raises(NotFound):
            await keys.revoke(user_id, key_id)
    await keys.revoke("u1", created["id"])
    revoked = await local.meta.get_api_key_by_hash(digest(created["key"]))
    assert revoked is None or revoked.revoked_at is not None


@pytest.mark.parametrize("name", [7, "x" * (MAX_NAME_CHARS + 1), ["ci"]])
async def test_an_api_key_name_is_a_short_string(local: Local, name: object) -> None:
    owner = await local.user("u1")
    with pytest.raises(BadRequest):
        await ApiKeyService(local.meta).create(owner, name)
    assert await local.meta.list_api_keys("u1", 0, 10) == ([], 0)


async def test_settings_update_validates_every_field_before_writing(local: Local) -> None:
    user = await local.user("u1")
    settings = AccountSettings(local.meta, DomainService(local.meta, ManualProvider()), CAP)
    assert (await settings.get(user))["max_upload_size_bytes"] == CAP
    for bad in ({"max_upload_size_bytes": CAP + 1}, {"max_upload_size_bytes": True},
                {"max_upload_size_bytes": 5, "refresh_custom_domain": "yes"}):
        with pytest.raises(BadRequest) as refused:
            await settings.update(user, bad)
        assert refused.value.code == "INVALID_SETTINGS"
    assert (await settings.get(user))["max_upload_size_bytes"] == CAP  # nothing was written
    assert (await settings.update(user, {"max_upload_size_bytes": 500}))["max_upload_size_bytes"] == 500
    assert (await settings.update(user, {}))["max_upload_size_bytes"] == 500  # absent: unchanged
    assert (await settings.update(user, {"max_upload_size_bytes": None}))["max_upload_size_bytes"] == CAP


async def test_usage_reads_the_stored_totals(local: Local, tmp_path: Path) -> None:
    user = await local.user("u1")  # the caller's copy, before any upload
    await local.file("u1", b"12345")
    await local.meta.add_usage({("u1", period_key()): UsageCounts(origin_reads=3, image_ops=1)})
    info = AccountInfo(Settings.from_env({"MEDIASRV_DATA_DIR": str(tmp_path)}), local.meta)
    usage = await info.usage(user)
    assert (usage["storage_bytes"], usage["files_count"], usage["origin_reads"], usage["image_ops"]) == (5, 1, 3, 1)
    assert info.profile(user)["user"]["id"] == "u1"


class Unreachable:
    async def health(self) -> dict[str, Any]:
        return {"ok": False, "backend": "fs", "error": "NotADirectoryError"}


async def test_health_is_ok_only_when_both_backends_answer(local: Local) -> None:
    assert (await HealthCheck(local.meta, local.blobs).run()).ok
    sick = await HealthCheck(local.meta, Unreachable()).run()  # type: ignore[arg-type]
    assert not sick.ok and sick.blobs["error"] == "NotADirectoryError" and sick.meta["ok"]
