"""The embedded default when no context store is configured: tags from a JWT's claims.

The token is only decoded, never trusted: tags only choose an intent class, they grant nothing.
Only the claims below are read; anything else in the token (names, emails) is ignored.
"""
import base64
import json

TAG_CLAIMS = ("tags", "intent", "category", "scope", "scp")


def tags_from_token(user_token):
    claims = _jwt_claims(user_token)
    if claims is None:
        return []
    tags = []
    for claim in TAG_CLAIMS:
        value = claims.get(claim)
        if isinstance(value, str):
            tags.extend(value.split())
        elif isinstance(value, list):
            tags.extend(item for item in value if isinstance(item, str))
    return tags[:100]


def _jwt_claims(user_token):
    parts = user_token.split(".")
    if len(parts) != 3:
        return None
    payload = parts[1]
    try:
        decoded = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
        claims = json.loads(decoded)
    except (ValueError, RecursionError):
        return None
    return claims if isinstance(claims, dict) else None
