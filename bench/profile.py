"""Profile the verify hot path in process (pyinstrument), against the database and Redis that
bench/run configures:  .venv/bin/python bench/profile.py [--requests 2000]"""
import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pyinstrument import Profiler  # noqa: E402

from app import create_app  # noqa: E402
from app.tenants import service as tenant_service  # noqa: E402
from intentgate import ScaleResponse  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args()
    app = create_app({"LOG_LEVEL": "WARNING"})
    client = app.test_client()
    with app.app_context():
        provisioned = tenant_service.create_tenant(f"profile-{time.time_ns()}@example.com", "enterprise")
    headers = {"X-Service-Key": provisioned.api_key}
    bodies = []
    for _ in range(args.requests):
        intent_hash = client.post("/v1/intent/generate", headers=headers,
                                  json={"user_token": "profile-user-token"}).get_json()["intent_hash"]
        signed = ScaleResponse.sign(provisioned.signing_secret, intent_hash, {"answer": "profile"})
        bodies.append({"original_intent_hash": intent_hash, "response": signed.to_dict()})
    profiler = Profiler(interval=0.0005)
    started = time.perf_counter()
    with profiler:
        for body in bodies:
            assert client.post("/v1/intent/verify", headers=headers, json=body).get_json()["cleared"]
    elapsed = time.perf_counter() - started
    print(f"{args.requests} verifies in {elapsed:.2f}s: {elapsed / args.requests * 1000:.2f} ms each")
    print(profiler.output_text(unicode=False, color=False, show_all=False, short_mode=True))


if __name__ == "__main__":
    main()
