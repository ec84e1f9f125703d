"""The intent endpoints: generate (before the AI call) and verify (after it)."""
from flask import Blueprint, g, jsonify

from app.auth import authenticate
from app.http import json_body
from app.sql import single_statement
from app.intents import gate, idempotency, service
from app.intents.schemas import (
    generate_schema,
    intent_signature_schema,
    verification_result_schema,
    verify_schema,
)

bp = Blueprint("intent", __name__, url_prefix="/v1/intent")


@bp.post("/generate")
@authenticate()
def generate():
    request_fields = generate_schema.load(json_body())
    return intent_signature_schema.dump(service.generate(g.principal, **request_fields))


@bp.post("/verify")
# Without an Idempotency-Key a verify writes with one statement (gate._VERIFY_SQL).
@single_statement(unless_header=idempotency.HEADER)
@authenticate()
def verify():
    idempotency_key = idempotency.key_from_request()
    body = json_body()
    request_fields = verify_schema.load(body)
    verdict, replayed = gate.verify(g.principal, request_fields["original_intent_hash"],
                                    request_fields["response"], body, idempotency_key)
    response = jsonify(verification_result_schema.dump(verdict))
    if replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return response
