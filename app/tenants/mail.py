"""Key delivery by email (SPEC.md, Authentication 3)."""
import logging
import smtplib
import ssl
from email.message import EmailMessage

from flask import current_app

log = logging.getLogger(__name__)

BODY = """Welcome to the intent verification service ({plan} plan).

Your API key (send it in the X-Service-Key header; keep it out of URLs and client-side code):

    {api_key}

Your response signing secret (give it to your AI service, which signs its responses with it):

    {signing_secret}

Neither is stored by us in readable form. If you lose one, rotate it to get a new one.
"""


def send_api_key(email, plan, api_key, signing_secret):
    """Send the key; return (sent, error text). Never raises for a delivery failure."""
    config = current_app.config
    if not config["SMTP_HOST"]:
        return False, "SMTP_HOST is not configured"
    message = EmailMessage()
    message["From"] = config["MAIL_FROM"]
    message["To"] = email
    message["Subject"] = "Your intent verification API key"
    message.set_content(BODY.format(plan=plan, api_key=api_key, signing_secret=signing_secret))
    try:
        with smtplib.SMTP(config["SMTP_HOST"], config["SMTP_PORT"],
                          timeout=config["SMTP_TIMEOUT"]) as smtp:
            if config["SMTP_STARTTLS"]:
                # The message holds the key and the signing secret: TLS to a server whose
                # certificate is checked (the system's CAs, or SSL_CERT_FILE). smtplib's own
                # default context checks nothing, so anyone on the path could read them.
                smtp.starttls(context=ssl.create_default_context())
            if config["SMTP_USERNAME"]:
                smtp.login(config["SMTP_USERNAME"], config["SMTP_PASSWORD"] or "")
            smtp.send_message(message)
    except (OSError, smtplib.SMTPException) as exc:
        # The exception class only: SMTP replies can echo the message, which holds the key.
        log.warning("key email not delivered", extra={"failure": type(exc).__name__})
        return False, f"email delivery failed ({type(exc).__name__})"
    log.info("key email delivered")
    return True, None
