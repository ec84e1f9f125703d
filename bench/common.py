"""Setup shared by the in-process measurements (profile.py, breakdown.py)."""
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app import create_app  # noqa: E402
from app.sql import unit_of_work  # noqa: E402
from app.tenants import service as tenant_service  # noqa: E402
from intentgate import ScaleResponse  # noqa: E402


def verify_workload(count):
    """An app on the configured database, an enterprise tenant, and `count` signed verify bodies
    for fresh intents. Returns (app, test client, headers, bodies)."""
    app = create_app({"LOG_LEVEL": "WARNING"})
    client = app.test_client()
    with app.app_context(), unit_of_work():
        provisioned = tenant_service.create_tenant(f"bench-{time.time_ns()}@example.com",
                                                   "enterprise")
    headers = {"X-Service-Key": provisioned.api_key}
    bodies = []
    for _ in range(count):
        intent_hash = client.post("/v1/intent/generate", headers=headers,
                                  json={"user_token": "bench-user-token"}).get_json()["intent_hash"]
        signed = ScaleResponse.sign(provisioned.signing_secret, intent_hash, {"answer": "bench"})
        bodies.append({"original_intent_hash": intent_hash, "response": signed.to_dict()})
    return app, client, headers, bodies
