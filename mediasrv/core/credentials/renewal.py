"""A new password ends every credential made before it: one function for the reset link
(``AccountService.reset_password``) and the operator's ``users set-password``.

The store's ``set_password`` moves the account's token_version and credential_epoch in the same
write as the hash, and every check compares against them (session tokens and refresh tokens
carry token_version; API keys and signed URLs are bound to credential_epoch), so nothing made
before the change works after it, even one minted by a request in flight across it. The rows
retired here (refresh and reset tokens, API keys) are the tidy-up on top: a key list that shows
only keys that work, a reset link that cannot be used twice.
"""
from __future__ import annotations

from store.base import MetaStore

KEYS_PAGE = 100


async def replace_password(meta: MetaStore, user_id: str, password_hash: str, at: str) -> int:
    """Set the new hash and end every session, refresh token, reset link, API key and signed URL
    of the account made before it; how many API keys were revoked."""
    await meta.set_password(user_id, password_hash, at)
    await meta.revoke_tokens("refresh", user_id)
    await meta.revoke_tokens("reset", user_id)
    return await revoke_api_keys(meta, user_id, at)


async def revoke_api_keys(meta: MetaStore, user_id: str, at: str) -> int:
    """Revoke every API key of the account; how many were revoked."""
    revoked = 0
    while True:
        keys, _total = await meta.list_api_keys(user_id, 0, KEYS_PAGE)
        if not keys:
            return revoked
        done = [await meta.revoke_api_key(user_id, key.id, at) for key in keys]
        if not any(done):
            return revoked  # revoked meanwhile by someone else: nothing left to do
        revoked += sum(done)
