"""End-to-end over real HTTP: register -> confirm -> login -> upload -> serve."""
import uuid

from tests.conftest import Api, body


async def test_register_confirm_login_upload_and_serve(api: Api) -> None:
    login = await api.user(f"u-{uuid.uuid4().hex[:8]}@example.com")
    token = login["session"]["access_token"]
    r = await api.call("POST", "/files", body=b"hello world", token=token,
                       headers={"Content-Type": "text/plain", "x-file-name": "a%20b.txt"})
    assert r.code == 201, r.body
    f = body(r)["file"]
    assert f["name"] == "a b.txt" and f["size"] == 11
    r = await api.call("GET", f"/m/{f['file_id']}")
    assert r.code == 200 and r.body == b"hello world"
    assert r.headers["X-Content-Type-Options"] == "nosniff"
