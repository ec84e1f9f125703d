"""The OpenAPI 3 document, generated from the marshmallow schemas the endpoints use (apispec)."""
from apispec import APISpec
from apispec.ext.marshmallow import MarshmallowPlugin
from flask import Blueprint, current_app
from marshmallow import Schema, fields

from app.intents.reasons import BLOCK_REASONS
from app.intents.schemas import (
    GenerateSchema,
    IntentSignatureSchema,
    VerificationResultSchema,
    VerifySchema,
)
from app.tenants.schemas import (
    RotateKeySchema,
    TenantCreatedSchema,
    TenantCreateSchema,
    TenantSchema,
    TenantUpdateSchema,
    UsageSchema,
)

bp = Blueprint("openapi", __name__)


class ErrorSchema(Schema):
    error = fields.String(required=True, metadata={"description": "The error text."})
    request_id = fields.String(required=True, metadata={"description": "Same as X-Request-Id."})
    details = fields.Dict(metadata={"description": "Per-field validation messages."})
    retry_after = fields.Integer(metadata={"description": "On 429: seconds to wait."})


class HealthSchema(Schema):
    status = fields.String(required=True, metadata={"enum": ["ok", "unavailable"]})
    checks = fields.Dict(keys=fields.String(), values=fields.String(), required=True)
    error = fields.String()
    request_id = fields.String()


class TenantListSchema(Schema):
    tenants = fields.List(fields.Nested(TenantSchema), required=True)
    has_more = fields.Boolean(required=True)


HEADERS = {
    "X-Request-Id": ("Correlation id: the caller's when it matches ^[A-Za-z0-9._-]{1,128}$, "
                     "else a new one.", "string"),
    "X-RateLimit-Limit": ("Token bucket capacity (or, on 401, the per-address failure limit).",
                          "integer"),
    "X-RateLimit-Remaining": ("Whole tokens left.", "integer"),
    "X-RateLimit-Reset": ("Unix time at which the bucket is full again.", "integer"),
    "Retry-After": ("Seconds to wait before retrying.", "integer"),
    "Idempotent-Replayed": ("`true` when this verify result replays an earlier one.", "string"),
}
ERRORS = {
    "400": "Malformed JSON, wrong Content-Type, unknown or invalid fields.",
    "401": "Missing, invalid, rotated or deactivated X-Service-Key.",
    "403": "The key is of the wrong kind for this endpoint.",
    "404": "Not found.",
    "413": "Body over 64 KiB.",
    "422": "Idempotency-Key reused with a different body.",
    "429": "`rate limit exceeded` or `monthly verification limit reached`.",
    "502": "`context store request failed`.",
    "409": "A tenant with this email already exists.",
    "503": "`Multi-tenancy not configured`, or the database or rate-limit store is down.",
}
V1_HEADERS = ["X-Request-Id", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"]


def _headers(names):
    headers = {}
    for name in names:
        description, kind = HEADERS[name]
        headers[name] = {"description": description, "required": name == "X-Request-Id",
                         "schema": {"type": kind}}
    return headers


def _json(schema, description, headers=V1_HEADERS):
    return {"description": description, "headers": _headers(headers),
            "content": {"application/json": {"schema": schema}}}


def _operation(summary, body, ok, errors, secured=True, parameters=(), status="200",
               ok_headers=V1_HEADERS):
    responses = {status: _json(ok, "Success.", ok_headers)}
    for code in errors:
        headers = V1_HEADERS + (["Retry-After"] if code in ("429", "503") else [])
        responses[code] = _json("Error", ERRORS[code], headers)
    operation = {"summary": summary, "responses": responses, "parameters": list(parameters)}
    if body:
        operation["requestBody"] = {"required": True,
                                    "content": {"application/json": {"schema": body}}}
    operation["security"] = [{"ServiceKey": []}] if secured else []
    return operation


IDEMPOTENCY = {"name": "Idempotency-Key", "in": "header", "required": False,
               "description": "Retries with the same key and body within 24 h replay the verdict.",
               "schema": {"type": "string", "minLength": 1, "maxLength": 255}}
TENANT_ID = {"name": "tenant_id", "in": "path", "required": True, "schema": {"type": "integer"}}
COMMON = ["400", "401", "413", "429", "503"]


def build_spec():
    spec = APISpec(title="Intent verification service", version="1.0.0", openapi_version="3.0.3",
                   plugins=[MarshmallowPlugin()],
                   info={"description": "Block reasons of verify, in check order: "
                                        + ", ".join(BLOCK_REASONS) + "."})
    spec.components.security_scheme(
        "ServiceKey", {"type": "apiKey", "in": "header", "name": "X-Service-Key"})
    for name, schema in [("Error", ErrorSchema), ("Health", HealthSchema),
                         ("GenerateRequest", GenerateSchema), ("IntentSignature", IntentSignatureSchema),
                         ("VerifyRequest", VerifySchema), ("VerificationResult", VerificationResultSchema),
                         ("Usage", UsageSchema), ("KeyRotation", RotateKeySchema),
                         ("TenantCreateRequest", TenantCreateSchema),
                         ("TenantUpdateRequest", TenantUpdateSchema), ("Tenant", TenantSchema),
                         ("TenantCreated", TenantCreatedSchema),
                         ("TenantList", TenantListSchema)]:
        spec.components.schema(name, schema=schema)

    spec.path("/health", operations={"get": _operation(
        "Health of the database and the rate-limit store", None, "Health", ["503"], secured=False,
        ok_headers=["X-Request-Id"])})
    spec.path("/v1/intent/generate", operations={"post": _operation(
        "Issue a single-use intent signature", "GenerateRequest", "IntentSignature",
        COMMON + ["403", "502"])})
    spec.path("/v1/intent/verify", operations={"post": _operation(
        "Pass an AI response through the verification gate (200 for cleared and blocked)",
        "VerifyRequest", "VerificationResult", COMMON + ["403", "422"],
        parameters=[IDEMPOTENCY], ok_headers=V1_HEADERS + ["Idempotent-Replayed"])})
    spec.path("/v1/tenant/usage", operations={"get": _operation(
        "This month's usage against the plan", None, "Usage", COMMON + ["403"])})
    spec.path("/v1/tenant/rotate-key", operations={"post": _operation(
        "Issue a new key; the old one is invalid at once", None, "KeyRotation", COMMON + ["403"])})
    spec.path("/v1/admin/tenants", operations={
        "post": _operation("Provision a tenant (admin key)", "TenantCreateRequest", "TenantCreated",
                           COMMON + ["403", "409"], status="201"),
        "get": _operation("List tenants (admin key)", None, "TenantList", COMMON + ["403"], parameters=[
            {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 200}},
            {"name": "starting_after", "in": "query",
             "schema": {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}}])})
    spec.path("/v1/admin/tenants/{tenant_id}", operations={
        "get": _operation("Read a tenant (admin key)", None, "Tenant", COMMON + ["403", "404"],
                          parameters=[TENANT_ID]),
        "patch": _operation("Change plan, active flag or signature scheme (admin key)",
                            "TenantUpdateRequest", "Tenant", COMMON + ["403", "404"],
                            parameters=[TENANT_ID])})
    document = spec.to_dict()
    # A PATCH must change something (the schema's own rule, which marshmallow cannot export).
    document["components"]["schemas"]["TenantUpdateRequest"]["minProperties"] = 1
    return document


@bp.get("/openapi.json")
def openapi_document():
    document = current_app.extensions.get("openapi")
    if document is None:
        document = current_app.extensions["openapi"] = build_spec()
    return document
