"""Small helpers shared by the tests (no fixtures here)."""
from dataclasses import dataclass


@dataclass(frozen=True)
class Credentials:
    tenant_id: int
    email: str
    api_key: str
    signing_secret: str

    @property
    def headers(self):
        return {"X-Service-Key": self.api_key}


def assert_envelope(response, status, error=None):
    """The contract's error envelope: exact text, request id equal to the header."""
    assert response.status_code == status, response.get_data(as_text=True)
    body = response.get_json()
    assert body["request_id"] == response.headers["X-Request-Id"]
    if error is not None:
        assert body["error"] == error
    return body
