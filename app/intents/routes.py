"""The intent endpoints: generate (before the AI call) and verify (after it)."""
from flask import Blueprint, g

from app.auth import authenticate
from app.http import json_body
from app.intents import service
from app.intents.schemas import generate_schema, intent_signature_schema

bp = Blueprint("intent", __name__, url_prefix="/v1/intent")


@bp.post("/generate")
@authenticate()
def generate():
    request_fields = generate_schema.load(json_body())
    return intent_signature_schema.dump(service.generate(g.principal, **request_fields))
