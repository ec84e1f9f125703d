"""The reference the benchmark measures the service against: an ordinary Flask app with
Flask-SQLAlchemy, served by the same gunicorn settings (bench/driver.py starts it with
`deploy/gunicorn.conf.py bench.reference:app`) on a database of its own.

  /json  a bare Flask view returning a small JSON object (the framework's floor);
  /pg    one `UPDATE ... RETURNING` on a single hot row and a commit (the least that any durable
         single-use check costs: one statement, one round trip, one synchronous WAL flush).

REFERENCE_DATABASE_URL names the database; `flask --app bench.reference init-db` creates the
table and its one row (bench/run does it before the driver starts).
"""
import os

import click
from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import text

db = SQLAlchemy()

# Written as text so the reference is exactly this one statement (no ORM unit of work).
_BUMP = text("UPDATE bench_counter SET n = n + 1 WHERE id = 1 RETURNING n")


def create_app():
    app = Flask(__name__)
    app.config["SQLALCHEMY_DATABASE_URI"] = os.environ["REFERENCE_DATABASE_URL"]
    db.init_app(app)

    @app.get("/json")
    def bare_json():
        return {"status": "ok", "service": "reference"}

    @app.get("/pg")
    def hot_row_update():
        value = db.session.execute(_BUMP).scalar_one()
        db.session.commit()
        return {"n": value}

    @app.cli.command("init-db")
    def init_db():
        """Create bench_counter with its single row (id 1, n 0)."""
        db.session.execute(text("DROP TABLE IF EXISTS bench_counter"))
        db.session.execute(text("CREATE TABLE bench_counter (id integer PRIMARY KEY,"
                                " n bigint NOT NULL)"))
        db.session.execute(text("INSERT INTO bench_counter (id, n) VALUES (1, 0)"))
        db.session.commit()
        click.echo("bench_counter ready")

    return app


app = create_app()
