"""Issuing intent signatures, and purging the expired ones."""
import hashlib
import secrets
import time

from flask import current_app, g
from sqlalchemy import bindparam, delete, func, insert, select, tuple_

from app import database
from app.clock import now_seconds
from app.context_store import client as context_store
from app.extensions import db
from app.intents.models import IdempotencyRecord, Intent, SeenResponse
from app.tenants import metering


HASH_PREFIX = "sha256:"
IDEMPOTENCY_WINDOW = 24 * 3600


def new_intent_hash(owner):
    """sha256 over 32 fresh random bytes and server-side data only: nothing from the user."""
    material = secrets.token_bytes(32) + f"|{owner}|{time.time_ns()}".encode()
    return HASH_PREFIX + hashlib.sha256(material).hexdigest()


def _insert_intent():
    intents = Intent.__table__
    values = {name: bindparam(name) for name in (
        "intent_hash", "owner", "intent_class", "issued_at", "expires_at")}
    if database.current().dialect_name == "sqlite":
        # The key is (owner, id), and SQLite numbers only a lone INTEGER PRIMARY KEY: the
        # next id comes from the statement itself (SQLite runs one writer at a time).
        values["id"] = select(func.coalesce(func.max(intents.c.id), 0) + 1).scalar_subquery()
    return insert(intents).values(values)


def generate(principal, user_token, ttl):
    """Issue an intent signature: one INSERT, after the context store answered (no database
    transaction or lock is held while we wait on another service)."""
    metering.refuse_if_over_plan(principal)
    tags = context_store.tags_for(user_token)
    intent_class = current_app.extensions["taxonomy"].classify(tags)
    issued_at = now_seconds()
    intent = {"intent_hash": new_intent_hash(principal.owner), "owner": principal.owner,
              "intent_class": intent_class, "issued_at": issued_at,
              "expires_at": issued_at + ttl}
    database.execute("insert_intent", _insert_intent, intent)
    g.intent_class = intent_class  # for the access log line
    return intent


def purge_expired_intents(cutoff, batch_size):
    """Delete up to `batch_size` intents that expired before `cutoff`, with their replay
    records; return how many (0 when none is left)."""
    expired = db.session.execute(
        select(Intent.owner, Intent.id, Intent.match_id)
        .where(Intent.expires_at < cutoff).limit(batch_size)
    ).all()
    sightings = [(owner, match_id, id_) for owner, id_, match_id in expired if match_id]
    if sightings:
        # By the replay record's key; only the one this intent's verify wrote (intent_id).
        db.session.execute(delete(SeenResponse).where(tuple_(
            SeenResponse.owner, SeenResponse.match_id, SeenResponse.intent_id).in_(sightings)))
    if expired:
        db.session.execute(delete(Intent).where(
            tuple_(Intent.owner, Intent.id).in_([(owner, id_) for owner, id_, _ in expired])))
    return len(expired)


def purge_idempotency_records():
    """Delete idempotency records past their 24 h window; return how many."""
    return db.session.execute(
        delete(IdempotencyRecord).where(
            IdempotencyRecord.created_at < now_seconds() - IDEMPOTENCY_WINDOW
        )
    ).rowcount
