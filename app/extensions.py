"""Extension singletons: instantiated here, bound to the app in create_app."""
from flask_cors import CORS
from flask_migrate import Migrate
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import MetaData

from app.context_store.session import ContextStoreSession
from app.traffic.addresses import client_address
from app.traffic.limiter import Limiter

# Named constraints keep Alembic migrations identical on SQLite and PostgreSQL.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# expire_on_commit=False: the authenticated tenant stays readable after a request commits
# part of its work (e.g. before a slow context store call).
db = SQLAlchemy(
    metadata=MetaData(naming_convention=NAMING_CONVENTION),
    session_options={"expire_on_commit": False},
)
migrate = Migrate()
cors = CORS()
context_store = ContextStoreSession()
# The token bucket and the failure limit are declared per blueprint (app.traffic.limits) and
# checked once, after authentication (auto_check=False): the bucket is then the caller's. Its
# storage and strategy are bound from the settings in app.traffic.limits.init_app. Flask-Limiter's
# own Limiter, trimmed where it spent most per request (app.traffic.limiter).
limiter = Limiter(key_func=client_address, auto_check=False, strategy="token-bucket",
                  headers_enabled=False)
