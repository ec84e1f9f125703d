"""What a verify writes to the intent: one version, on the same page, with no index entry (a HOT
update on PostgreSQL), because the consume changes no indexed column and intents' pages keep
room for it (fillfactor). deploy/README's capacity model rests on this."""
import pytest
from sqlalchemy import create_engine, inspect, text

from app.config import normalize_database_url
from app.extensions import db
from app.intents import gate
from tests.conftest import TEST_DATABASE_URL
from tests.support import scale_response


def test_consuming_an_intent_changes_no_indexed_column(app):
    with app.app_context():
        inspector = inspect(db.engine)
        indexed = {column for index in inspector.get_indexes("intents")
                   for column in index["column_names"]}
        indexed |= set(inspector.get_pk_constraint("intents")["constrained_columns"])
        for constraint in inspector.get_unique_constraints("intents"):
            indexed |= set(constraint["column_names"])
        written = {getattr(column, "key", column) for column in gate._consume()._values}
    assert written == {"consumed_at", "match_id"}
    assert not written & indexed


@pytest.mark.skipif(not TEST_DATABASE_URL, reason="HOT updates are PostgreSQL's")
def test_every_consume_is_a_hot_update(client, tenant):
    """Read off the heap's pages (pageinspect): each consumed intent's version is a heap-only
    tuple, which PostgreSQL writes for a HOT update alone. The table's statistics would count
    other tests' updates too, which their backends report up to seconds later."""
    hashes = []
    for _ in range(40):
        intent_hash = client.post("/v1/intent/generate", headers=tenant.headers, json={
            "user_token": "hot-update-token"}).get_json()["intent_hash"]
        assert client.post("/v1/intent/verify", headers=tenant.headers, json={
            "original_intent_hash": intent_hash,
            "response": scale_response(tenant.signing_secret, intent_hash),
        }).get_json()["cleared"]
        hashes.append(intent_hash)
    engine = create_engine(normalize_database_url(TEST_DATABASE_URL))
    try:
        with engine.begin() as connection:
            connection.execute(text("CREATE EXTENSION IF NOT EXISTS pageinspect"))
            heap_only = connection.execute(text(
                "SELECT (item.t_infomask2 & 32768) <> 0"  # HEAP_ONLY_TUPLE
                " FROM intents, heap_page_items(get_raw_page("
                "  'intents', ((intents.ctid::text::point)[0])::int)) AS item"
                " WHERE intents.intent_hash = ANY(:hashes)"
                " AND intents.consumed_at IS NOT NULL"
                " AND item.lp = ((intents.ctid::text::point)[1])::int"),
                {"hashes": hashes}).scalars().all()
    finally:
        engine.dispose()
    assert heap_only == [True] * 40


@pytest.mark.skipif(not TEST_DATABASE_URL, reason="HOT updates are PostgreSQL's")
def test_consumes_find_room_on_their_own_page_while_pruning_cannot_run(client, tenant):
    """PostgreSQL frees a page's older versions (pruning) only once no snapshot can see them,
    and skips a page another backend holds: a report running, a replica's feedback, verifies of
    intents issued together. Until then each consume needs room for its version (some 48 bytes
    larger than the issued one) on the intent's own page, or it is no HOT update: an entry in
    every index, a full-page image in the WAL. A full page keeps room for a dozen of its
    intents' consumed versions (at the former 80 % fill: nine)."""
    engine = create_engine(normalize_database_url(TEST_DATABASE_URL))
    issued = [client.post("/v1/intent/generate", headers=tenant.headers, json={
        "user_token": "hot-update-token"}).get_json()["intent_hash"] for _ in range(80)]

    def pages(hashes):
        with engine.connect() as connection:
            return dict(connection.execute(text(
                "SELECT intent_hash, (ctid::text::point)[0] FROM intents"
                " WHERE intent_hash = ANY(:hashes)"), {"hashes": hashes}).all())

    before = pages(issued)
    # A page that filled up (not the last intent's, which may have room to spare), and twelve
    # of its intents.
    page = max(set(before.values()) - {before[issued[-1]]}, key=list(before.values()).count)
    consumed = [value for value in issued if before[value] == page][:12]
    assert len(consumed) == 12
    try:
        with engine.connect() as report:
            report.execute(text("BEGIN ISOLATION LEVEL REPEATABLE READ"))
            report.execute(text("SELECT count(*) FROM intents")).scalar_one()  # its snapshot
            for intent_hash in consumed:
                assert client.post("/v1/intent/verify", headers=tenant.headers, json={
                    "original_intent_hash": intent_hash,
                    "response": scale_response(tenant.signing_secret, intent_hash),
                }).get_json()["cleared"]
            after = pages(consumed)
            report.execute(text("ROLLBACK"))
        assert after == {value: page for value in consumed}
    finally:
        engine.dispose()


@pytest.mark.skipif(not TEST_DATABASE_URL, reason="PostgreSQL's write-ahead log")
def test_a_day_already_counted_is_added_to_without_locking_its_row_first(client, tenant):
    """Read off the write-ahead log (pg_walinspect): a verification adds to its day's
    daily_usage row with a plain UPDATE. The upsert's ON CONFLICT DO UPDATE locked the row
    before updating it, one more WAL record each time."""
    def verify():
        intent_hash = client.post("/v1/intent/generate", headers=tenant.headers, json={
            "user_token": "day-count-token"}).get_json()["intent_hash"]
        assert client.post("/v1/intent/verify", headers=tenant.headers, json={
            "original_intent_hash": intent_hash,
            "response": scale_response(tenant.signing_secret, intent_hash),
        }).get_json()["cleared"]

    engine = create_engine(normalize_database_url(TEST_DATABASE_URL))
    try:
        with engine.begin() as connection:
            connection.execute(text("CREATE EXTENSION IF NOT EXISTS pg_walinspect"))
        verify()  # the day's row of this connection's shard is there from now on
        with engine.begin() as connection:
            start = connection.execute(text("SELECT pg_current_wal_lsn()")).scalar_one()
        for _ in range(5):
            verify()
        with engine.begin() as connection:
            written = connection.execute(text(
                "SELECT record.record_type FROM pg_get_wal_records_info("
                "  CAST(:start AS pg_lsn), pg_current_wal_lsn()) AS record"
                " WHERE record.block_ref LIKE '%rel ' || (SELECT format('%s/%s/%s',"
                "  coalesce(nullif(relation.reltablespace, 0),"
                "   (SELECT oid FROM pg_tablespace WHERE spcname = 'pg_default')),"
                "  (SELECT oid FROM pg_database WHERE datname = current_database()),"
                "  pg_relation_filenode(relation.oid))"
                "  FROM pg_class AS relation WHERE relation.oid = 'daily_usage'::regclass)"
                " || ' fork main %'"), {"start": start}).scalars().all()
    finally:
        engine.dispose()
    assert "LOCK" not in written
    assert sum(kind in ("UPDATE", "HOT_UPDATE") for kind in written) == 5, written
