"""Entry point for gunicorn (gunicorn -c deploy/gunicorn.conf.py wsgi:app) and the flask CLI
(FLASK_APP=wsgi). A bad setting stops either with one line naming the variable."""
from app import create_app
from app.config import exit_on_config_error

with exit_on_config_error():
    app = create_app()
