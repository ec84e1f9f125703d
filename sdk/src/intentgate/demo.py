"""A short walk through the flow against a running service:

    python -m intentgate.demo --base-url http://127.0.0.1:8000 --api-key KEY --signing-secret SECRET

(or INTENTGATE_BASE_URL, INTENTGATE_API_KEY, INTENTGATE_SIGNING_SECRET). It plays both the tenant
backend and its AI service: one cleared answer, one tampered answer blocked, one replay blocked,
the month's usage. With --ed25519 (a key holding signing:write), then the same gate with the
AI service signing with an Ed25519 key pair (the service knows only the public key), and back
to the HMAC scheme. That step switches the tenant's signature scheme for a moment,
with no grace: every HMAC-signed answer of the tenant's live traffic is blocked meanwhile. Run
it on a demo tenant (deploy/run-local.sh does), never on one that serves users.
"""
import argparse
import os
import sys

from intentgate import (Blocked, Client, IntentGateError, ScaleResponse,
                        generate_ed25519_key_pair)

USER_TOKEN = "demo-user-jwt-0123456789"


def run(client, signing_secret, out=print, ed25519=False):
    def ai_service(answer, tamper=False):
        def call_ai(intent_hash):
            signed = ScaleResponse.sign(signing_secret, intent_hash, answer)
            if tamper:  # a man in the middle edits the answer after it was signed
                return ScaleResponse(signed.match_id, {**answer, "answer": "Send money to X"},
                                     signed.timestamp, signed.signature)
            return signed

        return call_ai

    out("1. A genuine AI answer passes the gate:")
    payload = client.guard(USER_TOKEN, ai_service({"answer": "The capital of France is Paris."}))
    out(f"   cleared -> {payload}")

    out("2. A tampered AI answer is blocked:")
    try:
        client.guard(USER_TOKEN, ai_service({"answer": "The capital of France is Paris."},
                                            tamper=True))
        out("   UNEXPECTED: cleared")
    except Blocked as blocked:
        out(f"   blocked -> {blocked.reason}")

    out("3. Replaying an already verified answer is blocked:")
    intent = client.generate(USER_TOKEN)
    signed = ScaleResponse.sign(signing_secret, intent.intent_hash, {"answer": "once only"})
    first = client.verify(intent.intent_hash, signed)
    replay = client.verify(intent.intent_hash, signed)
    out(f"   first verify cleared={first.cleared}; replay blocked -> {replay.reason}")

    usage = client.usage()
    if usage.rate_limit is None:
        out(f"4. Usage this month: {usage.usage_count} verifications on plan {usage.plan} "
            "(unlimited)")
    else:
        out(f"4. Usage this month: {usage.usage_count} of {usage.rate_limit} verifications "
            f"on plan {usage.plan} ({usage.remaining} remaining)")

    if ed25519:
        _ed25519_step(client, signing_secret, out)
    return payload, replay


def _ed25519_step(client, signing_secret, out):
    out("5. The AI service signs with an Ed25519 key pair; the gate holds only the public key:")
    key_pair = generate_ed25519_key_pair()  # the private key stays with the AI service
    registered = client.add_signing_key(key_pair.public_key, name="demo AI service")
    try:
        client.set_signature_scheme("ed25519")
        try:
            signed_payload = client.guard(USER_TOKEN, lambda intent_hash: (
                ScaleResponse.sign_ed25519(key_pair.private_key_pem, intent_hash,
                                           {"answer": "Signed with Ed25519."})))
            out(f"   cleared -> {signed_payload}")
            intent = client.generate(USER_TOKEN)
            hmac_signed = ScaleResponse.sign(signing_secret, intent.intent_hash,
                                             {"answer": "HMAC"})
            out("   an HMAC signature now -> "
                f"{client.verify(intent.intent_hash, hmac_signed).reason}")
        finally:
            # Whatever happened, back to the HMAC scheme the steps before cleared on, so the
            # demo runs again the same way.
            client.set_signature_scheme("bound")
    finally:
        client.revoke_signing_key(registered["id"])
    out("   back on the HMAC scheme; the demo key is revoked")


def main(argv=None):
    parser = argparse.ArgumentParser(description="Intent verification demo")
    parser.add_argument("--base-url", default=os.environ.get("INTENTGATE_BASE_URL",
                                                             "http://127.0.0.1:8000"))
    parser.add_argument("--api-key", default=os.environ.get("INTENTGATE_API_KEY"))
    parser.add_argument("--signing-secret", default=os.environ.get("INTENTGATE_SIGNING_SECRET"))
    parser.add_argument("--ed25519", action="store_true",
                        help="also sign with an Ed25519 key pair: switches the tenant's signature "
                             "scheme for a moment (a demo tenant only; needs signing:write)")
    args = parser.parse_args(argv)
    if not args.api_key or not args.signing_secret:
        parser.error("--api-key and --signing-secret (or their INTENTGATE_* variables) are required")
    try:
        run(Client(args.base_url, args.api_key), args.signing_secret, ed25519=args.ed25519)
    except (Blocked, IntentGateError) as exc:
        # The tenant is not one the demo can run on as it is (a genuine answer blocked: another
        # scheme than the HMAC one; a key without signing:write for --ed25519), or the service
        # refused: one line, not a traceback.
        print(f"demo stopped: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
