"""The OpenAPI 3 document at /openapi.json, built by flask-smorest from the views themselves.

A view documents itself with the decorators that also do its work: `@bp.arguments(Schema)`
loads the body (or query) through app.http.json_body and the schema, `@bp.response(200,
Schema)` dumps the answer, `@bp.error(409, "...")` names an error the view raises itself. What
every operation shares is added here, once, because app-wide code does it for every request:
X-Request-Id on every response (app.http), and for /v1/*, which authenticate and the rate
limits guard, the ServiceKey scheme, X-RateLimit-* on every response (app.traffic.limits) and the
errors those decorators and the request plumbing raise. See the README's API reference.
"""
from functools import wraps

import flask
import flask_smorest
from apispec import BasePlugin
from flask import current_app, request
from marshmallow import EXCLUDE, Schema, fields

from app.http import json_body
from app.intents.reasons import BLOCK_REASONS
from app.intents.schemas import PAYLOAD_VALUE


class ErrorSchema(Schema):
    """The envelope app.errors.error_response writes for every 4xx and 5xx."""

    error = fields.String(required=True, metadata={"description": "The error text."})
    request_id = fields.String(required=True, metadata={"description": "Same as X-Request-Id."})
    details = fields.Dict(metadata={"description": "Per-field validation messages."})
    retry_after = fields.Integer(metadata={"description": "On 429: seconds to wait."})


class Blueprint(flask_smorest.Blueprint):
    """flask-smorest's Blueprint: its decorators document the view; bodies are read by
    app.http.json_body alone (webargs parses nothing), so there is one parsing path."""

    def arguments(self, schema, *, location="json", required=True, **kwargs):
        """Load the body through app.http.json_body (or, with location="query", the query
        string) with `schema`, pass the fields to the view, and document both. With
        required=False an empty body stands for {}. Errors are the schema's ValidationError,
        which app.errors renders (400)."""
        schema = schema() if isinstance(schema, type) else schema
        read = _READERS[location]
        # flask-smorest only records the documentation here; webargs does not parse.
        documented = _recorded(super().arguments(schema, location=location, required=required,
                                                 error_status_code=400, **kwargs))

        def decorator(view):
            @wraps(view)
            def loaded(*args, **kwargs):
                return view(*args, read(schema, required), **kwargs)

            # Seen by the decorators above it (functools.wraps copies it): this view reads a
            # body, where app.auth holds any other view to none (app.http.no_body).
            loaded.reads_body = location == "json"
            return documented(loaded)

        return decorator

    # Documentation-only decorators: keep what they record, not their per-request wrapper.
    def alt_response(self, *args, **kwargs):
        return _recorded(super().alt_response(*args, **kwargs))

    @staticmethod
    def doc(**kwargs):
        return _recorded(flask_smorest.Blueprint.doc(**kwargs))

    def error(self, status, description):
        """Document an error status the view itself raises, in the error envelope."""
        return self.alt_response(status, schema=ErrorSchema, description=description)


_READERS = {
    "json": lambda schema, required: schema.load(json_body(allow_empty=not required)),
    # Query strings carry what proxies and caches add: unknown parameters are ignored.
    "query": lambda schema, required: schema.load(request.args, unknown=EXCLUDE),
}


def _recorded(decorator):
    """Apply a flask-smorest decorator for its record (`_apidoc`, read when the route is
    registered) and return the view itself: nothing runs per request."""

    def record(view):
        view._apidoc = decorator(view)._apidoc
        return view

    return record


HEADERS = {
    "X-Request-Id": ("Correlation id: the caller's when it matches ^[A-Za-z0-9._-]{1,128}$ and "
                     "holds no key or secret (key_live_...), else a new one.", "string", True),
    "X-RateLimit-Limit": ("Token bucket capacity (or, on 401 and on answers made before the key "
                          "is read, the per-address failure limit).", "integer", False),
    "X-RateLimit-Remaining": ("Whole tokens left.", "integer", False),
    "X-RateLimit-Reset": ("Unix time at which the bucket is full again.", "integer", False),
    "Retry-After": ("Seconds to wait before retrying.", "integer", False),
}
RATE_HEADERS = ["X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"]
# What any /v1 operation may answer, whatever the view: the request plumbing (app.http,
# app.https_only, MAX_CONTENT_LENGTH), authenticate, the rate limits, and the database.
V1_ERRORS = {
    "400": "Malformed JSON, wrong Content-Type, unknown or invalid fields or parameters.",
    "401": "Missing, invalid, rotated or deactivated X-Service-Key.",
    "403": "The key is of the wrong kind for this endpoint, or plain HTTP where HTTPS is "
           "required.",
    "413": "Body over 64 KiB.",
    "415": "A body sent with a Content-Encoding: send it uncompressed.",
    "429": "`rate limit exceeded` (also for too many failed authentications from one address).",
    "501": "`transfer coding not supported`: a Transfer-Encoding other than chunked (a "
           "compressed body): send it uncompressed.",
    "503": "`Multi-tenancy not configured`, or the database or rate-limit store is down.",
}


class ServiceConventions(BasePlugin):
    """apispec plugin: what every operation shares (see the module docstring), and the JSON
    Schema keywords a schema states in `Meta.openapi` where marshmallow has no field option."""

    def schema_helper(self, name, definition, schema=None, **kwargs):
        return dict(getattr(getattr(schema, "Meta", None), "openapi", {}))

    def path_helper(self, path=None, operations=None, parameters=None, **kwargs):
        # Path parameters on each operation, so every key of a path item is a method.
        for operation in operations.values():
            operation["parameters"] = parameters + operation.get("parameters", [])
        parameters.clear()

    def operation_helper(self, path=None, operations=None, **kwargs):
        guarded = path.startswith("/v1/")
        for operation in operations.values():
            # Status keys as strings, so an error documented twice is one entry.
            responses = {str(status): response
                         for status, response in operation.get("responses", {}).items()}
            operation["security"] = [{"ServiceKey": []}] if guarded else []
            for status, description in V1_ERRORS.items() if guarded else ():
                if not isinstance(responses.get(status), dict):  # a view's own text wins
                    responses[status] = {"description": description,
                                         "content": {"application/json": {"schema": "Error"}}}
            for status, response in responses.items():
                names = ["X-Request-Id"] + (RATE_HEADERS if guarded else [])
                if status in ("429", "503"):
                    names.append("Retry-After")
                headers = response.setdefault("headers", {})
                for name in names:
                    headers.setdefault(name, name)  # a reference to components/headers
            operation["responses"] = dict(sorted(responses.items()))


class Api(flask_smorest.Api):
    ERROR_SCHEMA = ErrorSchema
    DEFAULT_ERROR_RESPONSE_NAME = None  # every error status is documented by its code

    def _register_error_handlers(self):
        """None: app.errors is the one place that renders errors."""


def build_document(app):
    """The OpenAPI document of every flask-smorest blueprint registered on the app."""
    api = Api(app, spec_kwargs={  # no OPENAPI_URL_PREFIX: flask-smorest adds no routes or UI
        "title": "Intent verification service", "version": "1.0.0", "openapi_version": "3.0.3",
        "extra_plugins": [ServiceConventions()],
        "info": {"description": "Block reasons of verify, in check order: "
                                + ", ".join(BLOCK_REASONS) + ". Each /v1 operation's `x-scope` "
                                "is the scope a tenant key needs for it (null: none); an admin "
                                "key holds every scope."},
    })
    components = api.spec.components
    components.security_scheme("ServiceKey",
                               {"type": "apiKey", "in": "header", "name": "X-Service-Key"})
    components.schema("PayloadValue", PAYLOAD_VALUE)
    for name, (description, kind, required) in HEADERS.items():
        components.header(name, {"description": description, "required": required,
                                 "schema": {"type": kind}})
    for name, blueprint in app.blueprints.items():
        if isinstance(blueprint, flask_smorest.Blueprint):
            # What Api.register_blueprint does besides registering: the app has them already.
            blueprint.register_views_in_doc(api, app, api.spec, name=name, parameters=None)
            api.spec.tag({"name": name, "description": blueprint.description})
    return api.spec.to_dict()


bp = flask.Blueprint("openapi", __name__)


@bp.get("/openapi.json")
def openapi_document():
    # Built on first request, not in create_app: workers and tests start without the cost.
    document = current_app.extensions.get("openapi")
    if document is None:
        document = current_app.extensions["openapi"] = build_document(current_app)
    return document
