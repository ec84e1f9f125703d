"""revoke Ed25519 signing keys of small order (they verify forged signatures)

Revision ID: a2c4e6f8b013
Revises: f7a1c3e5b920
Create Date: 2026-11-22 09:30:00

Until this release a tenant could register a "public key" such as the identity point, for which
a fixed forged signature verifies over any message. Registration now refuses such points; this
revokes any already stored, each with an entry in its tenant's audit log (actor `cli`, as for
every change made by a flask command). A tenant on the ed25519 scheme left without an active
key has its responses blocked as InvalidSignature until it adds a real key, as it should: they
could have been forged. Nothing to undo on downgrade.
"""
import base64
import json
import time

import sqlalchemy as sa
from alembic import op
from nacl.bindings import crypto_core_ed25519_is_valid_point

revision = 'a2c4e6f8b013'
down_revision = 'f7a1c3e5b920'
branch_labels = None
depends_on = None

signing_keys = sa.table("signing_keys", sa.column("tenant_id", sa.Integer),
                        sa.column("id", sa.String), sa.column("public_key", sa.String),
                        sa.column("revoked_at", sa.BigInteger))
tenants = sa.table("tenants", sa.column("id", sa.Integer))
audit_log = sa.table("audit_log", sa.column("tenant_id", sa.Integer),
                     sa.column("id", sa.BigInteger), sa.column("at", sa.BigInteger),
                     sa.column("action", sa.String), sa.column("actor", sa.String),
                     sa.column("details", sa.Text))


def _weak(public_key):
    try:
        raw = base64.b64decode(public_key, validate=True)
    except ValueError:
        return True
    return len(raw) != 32 or not crypto_core_ed25519_is_valid_point(raw)


def upgrade():
    connection = op.get_bind()
    now = int(time.time())
    active = connection.execute(
        sa.select(signing_keys.c.tenant_id, signing_keys.c.id, signing_keys.c.public_key)
        .where(signing_keys.c.revoked_at.is_(None))
    ).all()
    for key in (row for row in active if _weak(row.public_key)):
        # The tenant row's lock orders this with the service's own audited changes (they take
        # it too before numbering an entry).
        connection.execute(sa.select(tenants.c.id).where(tenants.c.id == key.tenant_id)
                           .with_for_update())
        connection.execute(
            signing_keys.update()
            .where(signing_keys.c.tenant_id == key.tenant_id, signing_keys.c.id == key.id)
            .values(revoked_at=now))
        next_id = connection.execute(
            sa.select(sa.func.coalesce(sa.func.max(audit_log.c.id), 0) + 1)
            .where(audit_log.c.tenant_id == key.tenant_id)
        ).scalar_one()
        connection.execute(audit_log.insert().values(
            tenant_id=key.tenant_id, id=next_id, at=now, action="signing_key.revoked",
            actor="cli", details=json.dumps({"key_id": key.id, "reason": "small order"},
                                            sort_keys=True)))


def downgrade():
    pass
