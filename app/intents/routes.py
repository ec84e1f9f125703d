"""The intent endpoints: generate (before the AI call) and verify (after it)."""
from flask import g

from app import database
from app.auth import authenticate, confirm_principal
from app.http import json_body
from app.intents import gate, idempotency, service
from app.intents.schemas import (
    GenerateSchema,
    IntentSignatureSchema,
    VerificationResultSchema,
    VerifySchema,
)
from app.intents.signature import canonical_json
from app.openapi import Blueprint
from app.tenants.scopes import INTENTS
from app.traffic import limits

bp = Blueprint("intent", __name__, url_prefix="/v1/intent")
limits.declare(bp)

MONTH_USED_UP = "`monthly verification limit reached`: the tenant's plan is used up this month."


@bp.post("/generate")
@bp.response(200, IntentSignatureSchema)
@bp.error(429, MONTH_USED_UP + " Also `rate limit exceeded`.")
@bp.error(502, "`context store request failed`: nothing was created or metered.")
@authenticate(scope=INTENTS, cached=True)
@bp.arguments(GenerateSchema)
def generate(request_fields):
    """Issue a single-use intent signature"""
    return service.generate(g.principal, **request_fields)


@bp.post("/verify")
@bp.response(200, VerificationResultSchema, headers=idempotency.RESPONSE_HEADERS)
@bp.doc(parameters=[idempotency.PARAMETER])
@bp.error(422, "Idempotency-Key reused with a different body.")
@bp.error(429, MONTH_USED_UP + " Also `rate limit exceeded`.")
@authenticate(scope=INTENTS, cached=True)
@bp.arguments(VerifySchema)
def verify(request_fields):
    """Pass an AI response through the verification gate (200 for cleared and blocked)"""
    idempotency_key = idempotency.key_from_request()
    if idempotency_key:
        confirm_principal()  # a stored verdict is answered before the gate would confirm it
    principal = g.principal
    # The bytes the signature is checked over are the bytes a cleared verdict answers.
    canonical_payload = canonical_json(request_fields["response"]["payload"])
    # The view owns the transaction. Without an Idempotency-Key the gate is one statement on
    # PostgreSQL, its own transaction; a retry's stored verdict is looked up first, before the
    # gate applies the plan limit.
    with database.transaction(single_statement=idempotency_key is None):
        earlier = idempotency_key and idempotency.claim(
            principal.owner, idempotency_key, idempotency.body_digest(json_body()))
        if earlier:
            verdict = gate.result(bool(earlier.cleared), earlier.reason, canonical_payload)
            return verdict, idempotency.REPLAYED
        reason = gate.verify(principal, request_fields["original_intent_hash"],
                             request_fields["response"], canonical_payload)
        if idempotency_key:
            idempotency.record_verdict(principal.owner, idempotency_key, reason)
    g.verdict = reason or "cleared"  # for the access log line and the metrics
    return gate.result(reason is None, reason, canonical_payload)
