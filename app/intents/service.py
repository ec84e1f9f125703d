"""Issuing intent signatures, and purging the expired ones."""
import hashlib
import logging
import secrets
import time

from flask import current_app
from sqlalchemy import delete, select

from app.clock import now_seconds
from app.context_store import client as context_store
from app.extensions import db
from app.intents.models import IdempotencyRecord, Intent, SeenResponse
from app.tenants import metering

log = logging.getLogger(__name__)

HASH_PREFIX = "sha256:"
IDEMPOTENCY_WINDOW = 24 * 3600


def new_intent_hash(owner):
    """sha256 over 32 fresh random bytes and server-side data only: nothing from the user."""
    material = secrets.token_bytes(32) + f"|{owner}|{time.time_ns()}".encode()
    return HASH_PREFIX + hashlib.sha256(material).hexdigest()


def generate(principal, user_token, ttl):
    metering.ensure_within_plan(principal)
    # End the read transaction before the (possibly slow) context store call, so no database
    # lock or pooled connection is held while we wait on another service.
    db.session.commit()
    tags = context_store.tags_for(user_token)
    intent_class = current_app.extensions["taxonomy"].classify(tags)
    issued_at = now_seconds()
    intent = Intent(
        intent_hash=new_intent_hash(principal.owner),
        owner=principal.owner,
        intent_class=intent_class,
        issued_at=issued_at,
        expires_at=issued_at + ttl,
    )
    db.session.add(intent)
    db.session.commit()
    log.info("intent issued", extra={"intent_class": intent_class, "ttl": ttl})
    return {"intent_hash": intent.intent_hash, "intent_class": intent_class,
            "expires_at": intent.expires_at}


def purge(retention_seconds, batch_size=1000, progress=None):
    """Delete intents expired more than `retention_seconds` ago, with their replay records,
    and idempotency records past their 24 h window; in batches, each its own transaction."""
    cutoff = now_seconds() - retention_seconds
    purged = 0
    while True:
        ids = db.session.execute(
            select(Intent.id).where(Intent.expires_at < cutoff).limit(batch_size)
        ).scalars().all()
        if not ids:
            break
        db.session.execute(delete(SeenResponse).where(SeenResponse.intent_id.in_(ids)))
        db.session.execute(delete(Intent).where(Intent.id.in_(ids)))
        db.session.commit()
        purged += len(ids)
        if progress:
            progress(f"purged {purged} intents")
    stale = db.session.execute(
        delete(IdempotencyRecord).where(
            IdempotencyRecord.created_at < now_seconds() - IDEMPOTENCY_WINDOW
        )
    ).rowcount
    db.session.commit()
    return purged, stale
