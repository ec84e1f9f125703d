"""The service's side of the benchmark data: the bench tenant, stored intents, signed bodies."""
import json
import time
from functools import cached_property

import requests
from sqlalchemy import insert, text

from app import create_app
from app.extensions import db
from app.intents.models import Intent
from app.intents.service import new_intent_hash
from app.sql import unit_of_work
from app.tenants import service as tenant_service
from app.tenants import signing
from intentgate import ScaleResponse, generate_ed25519_key_pair

GENERATE_BODY = json.dumps({"user_token": "eyJhbGciOiJub25lIn0.eyJ0YWdzIjpbImNhcnQiXX0.c2ln"})


class Workload:
    def __init__(self, service_url):
        self.service_url = service_url
        self.app = create_app()
        with self.app.app_context(), unit_of_work():
            # Enterprise plan: no monthly limit; bench/run makes the bucket too large to matter.
            provisioned = tenant_service.create_tenant("bench@example.com", "enterprise")
            self.owner = f"tenant:{provisioned.tenant.id}"
            # A second tenant whose AI service signs with an Ed25519 key pair.
            on_ed25519 = tenant_service.create_tenant("bench-ed25519@example.com", "enterprise")
            self.key_pair = generate_ed25519_key_pair()
            signing.add_signing_key(on_ed25519.tenant.id, self.key_pair.public_key)
            signing.set_signature_scheme(on_ed25519.tenant.id, "ed25519")
            self.ed25519_owner = f"tenant:{on_ed25519.tenant.id}"
        self.api_key, self.secret = provisioned.api_key, provisioned.signing_secret
        self.ed25519_api_key = on_ed25519.api_key
        self.unsettled = False

    # -- bodies, one JSON document per line --------------------------------------------------

    def verify_lines(self, hashes, ed25519=False):
        lines = []
        for intent_hash in hashes:
            if ed25519:
                signed = ScaleResponse.sign_ed25519(self.key_pair.private_key_pem, intent_hash,
                                                    {"answer": "benchmark"})
            else:
                signed = ScaleResponse.sign(self.secret, intent_hash, {"answer": "benchmark"})
            lines.append(json.dumps({"original_intent_hash": intent_hash,
                                     "response": signed.to_dict()}))
        return lines

    @cached_property
    def replayed_verify_line(self):
        """A verify body for an intent already used: every verify of it is ReplayedIntent."""
        (line,) = self.verify_lines(self.insert_intents(1))
        answer = requests.post(f"{self.service_url}/v1/intent/verify", data=line, timeout=30,
                               headers={"X-Service-Key": self.api_key,
                                        "Content-Type": "application/json"})
        assert answer.status_code == 200 and answer.json()["cleared"], answer.text
        return line

    # -- stored intents ----------------------------------------------------------------------

    def insert_intents(self, count, owner=None):
        """Insert `count` fresh intents for the bench tenant (or `owner`); return their hashes."""
        owner = owner or self.owner
        now = int(time.time())
        hashes = [new_intent_hash(owner) for _ in range(count)]
        with self.app.app_context():
            for start in range(0, count, 10_000):
                db.session.execute(insert(Intent), [
                    {"intent_hash": value, "owner": owner, "intent_class": "commerce",
                     "issued_at": now - 5, "expires_at": now + 86400}
                    for value in hashes[start:start + 10_000]])
                db.session.commit()
        self.unsettled = True
        return hashes

    def fill_to(self, stored):
        """Add other owners' intents until the table holds `stored` rows; return the count."""
        with self.app.app_context():
            missing = max(0, stored - self.stored())
            if missing:
                db.session.execute(text(
                    "INSERT INTO intents (intent_hash, owner, intent_class, issued_at, expires_at)"
                    " SELECT 'sha256:' || md5(g::text || 'a' || random()) || md5(g::text || 'b'),"
                    " 'tenant:0', 'other', 0, 1 FROM generate_series(1, :n) AS g"), {"n": missing})
                db.session.commit()
                self.unsettled = True
            return self.stored()

    def empty_intents(self):
        """Remove every stored intent (and what refers to them)."""
        with self.app.app_context():
            db.session.execute(text("TRUNCATE intents CASCADE"))
            db.session.commit()
        self.__dict__.pop("replayed_verify_line", None)
        self.unsettled = True

    def stored(self):
        with self.app.app_context():
            return db.session.execute(text("SELECT count(*) FROM intents")).scalar_one()

    def seen_responses(self):
        with self.app.app_context():
            return db.session.execute(text("SELECT count(*) FROM seen_responses")).scalar_one()

    def wal_position(self):
        """Bytes of WAL PostgreSQL has written so far, cluster-wide (both apps' databases live in
        one cluster and only one scenario runs at a time, so a run's difference is its own)."""
        with self.app.app_context():
            return int(db.session.execute(
                text("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")).scalar_one())

    def settle(self):
        """After bulk inserts: vacuum, analyze and checkpoint now, so that autovacuum and the
        checkpointer do not spend the next measurement's PostgreSQL CPU on our setup."""
        if not self.unsettled:
            return
        with self.app.app_context():
            with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(text("VACUUM (ANALYZE) intents"))
                conn.execute(text("CHECKPOINT"))
        self.unsettled = False
