"""Which HTTP operation each public method of the clients calls.

``tests/client/test_client.py`` checks this map against the served /reference/openapi.json, so a route
renamed on the server fails a test instead of a user's call.
"""
from __future__ import annotations

OPERATIONS: dict[str, tuple[str, str]] = {
    "ping": ("GET", "/ping"),
    "register": ("POST", "/auth/register"),
    "confirm_email": ("GET", "/auth/confirm"),
    "login": ("POST", "/auth/login"),
    "refresh": ("POST", "/auth/refresh"),
    "logout": ("POST", "/auth/logout"),
    "forgot_password": ("POST", "/auth/forgot-password"),
    "reset_password": ("POST", "/auth/reset-password"),
    "create_api_key": ("POST", "/auth/api-keys"),
    "list_api_keys": ("GET", "/auth/api-keys"),
    "revoke_api_key": ("DELETE", "/auth/api-keys/{id}"),
    "upload_file": ("POST", "/files"),
    "upload_bytes": ("POST", "/files"),
    "list_files": ("GET", "/files"),
    "get_file": ("GET", "/files/{id}"),
    "delete_file": ("DELETE", "/files/{id}"),
    "bulk_delete": ("POST", "/files/bulk-delete"),
    "signed_url": ("POST", "/files/{id}/signed-url"),
    "get_settings": ("GET", "/settings"),
    "update_settings": ("PATCH", "/settings"),
    "usage": ("GET", "/usage"),
    "daily_usage": ("GET", "/usage/daily"),
    "logs": ("GET", "/logs"),
    "profile": ("GET", "/profile"),
    "allowed_content_types": ("GET", "/reference/allowed-content-types"),
    "download": ("GET", "/d/{id}"),
    "download_media": ("GET", "/m/{id}"),
    "media_url": ("GET", "/m/{id}"),
}
"""Public method -> (METHOD, OpenAPI path) it calls."""
