"""A short walk through the flow against a running service:

    python -m intentgate.demo --base-url http://127.0.0.1:8000 --api-key KEY --signing-secret SECRET

(or INTENTGATE_BASE_URL, INTENTGATE_API_KEY, INTENTGATE_SIGNING_SECRET). It plays both the tenant
backend and its AI service: one cleared answer, one tampered answer blocked, one replay blocked,
the month's usage, then the same gate with the AI service signing with an Ed25519 key pair (the
service knows only the public key), and back to the HMAC scheme.
"""
import argparse
import os
import sys

from intentgate import Blocked, Client, ScaleResponse, generate_ed25519_key_pair

USER_TOKEN = "demo-user-jwt-0123456789"


def run(client, signing_secret, out=print):
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
    out(f"4. Usage this month: {usage.usage_count} of {usage.rate_limit} verifications "
        f"on plan {usage.plan} ({usage.remaining} remaining)")

    out("5. The AI service signs with an Ed25519 key pair; the gate holds only the public key:")
    key_pair = generate_ed25519_key_pair()  # the private key stays with the AI service
    registered = client.add_signing_key(key_pair.public_key, name="demo AI service")
    client.set_signature_scheme("ed25519")
    signed_payload = client.guard(USER_TOKEN, lambda intent_hash: ScaleResponse.sign_ed25519(
        key_pair.private_key_pem, intent_hash, {"answer": "Signed with Ed25519."}))
    out(f"   cleared -> {signed_payload}")
    intent = client.generate(USER_TOKEN)
    hmac_signed = ScaleResponse.sign(signing_secret, intent.intent_hash, {"answer": "HMAC"})
    out(f"   an HMAC signature now -> {client.verify(intent.intent_hash, hmac_signed).reason}")
    # Back to HMAC, so the demo runs again the same way.
    client.set_signature_scheme("bound")
    client.revoke_signing_key(registered["id"])
    out("   back on the HMAC scheme; the demo key is revoked")
    return payload, replay


def main(argv=None):
    parser = argparse.ArgumentParser(description="Intent verification demo")
    parser.add_argument("--base-url", default=os.environ.get("INTENTGATE_BASE_URL",
                                                             "http://127.0.0.1:8000"))
    parser.add_argument("--api-key", default=os.environ.get("INTENTGATE_API_KEY"))
    parser.add_argument("--signing-secret", default=os.environ.get("INTENTGATE_SIGNING_SECRET"))
    args = parser.parse_args(argv)
    if not args.api_key or not args.signing_secret:
        parser.error("--api-key and --signing-secret (or their INTENTGATE_* variables) are required")
    run(Client(args.base_url, args.api_key), args.signing_secret)
    return 0


if __name__ == "__main__":
    sys.exit(main())
