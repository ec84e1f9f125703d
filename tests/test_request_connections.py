"""The request path's connections: each thread keeps the one it took from the pool from one
request to the next, at most the pool's size of them (app.database)."""
import threading

from sqlalchemy import event

from app import database


def _checkouts(app):
    """A list that grows by one at each checkout from the request path's pool."""
    taken = []
    event.listen(app.extensions["database"].engine.pool, "checkout",
                 lambda *_args: taken.append(1))
    return taken


def test_a_thread_keeps_its_connection_from_one_request_to_the_next(app, client):
    taken = _checkouts(app)
    for _ in range(5):
        assert client.get("/health").status_code == 200
    assert len(taken) == 1
    assert app.extensions["database"].engine.pool.checkedout() == 1  # kept, between requests


def test_a_kept_connection_goes_back_to_the_pool_once_its_recycle_time_has_passed(app, client):
    app.extensions["database"].recycle_seconds = 0  # an hour in production (pool_recycle)
    taken = _checkouts(app)
    for _ in range(3):
        assert client.get("/health").status_code == 200
    assert len(taken) == 3


def test_threads_beyond_the_pool_size_check_their_connection_out_and_back(app, client):
    """A gthread worker of more threads than the pool holds: were every thread to keep one,
    the pool would run dry and the next thread wait for a connection nobody returns."""
    pool = app.extensions["database"].engine.pool
    threads, answers, done = 11, [], threading.Event()

    def one_request():
        answers.append(client.get("/health").status_code)
        done.wait(30)  # alive, with what it kept, until every thread has been answered

    running = [threading.Thread(target=one_request) for _ in range(threads)]
    try:
        for thread in running:
            thread.start()
            while len(answers) < running.index(thread) + 1 and thread.is_alive():
                thread.join(0.01)  # one after another: each finds the others' kept ones
        assert answers == [200] * threads
        assert pool.checkedout() == pool.size()  # kept: the pool's size, no more
    finally:
        done.set()
        for thread in running:
            thread.join()


def test_a_connection_left_in_a_transaction_is_not_kept(app, client, make_tenant):
    """A unit of work that never reached its COMMIT or ROLLBACK (a COMMIT SQLite refused, say)
    must not hand its open transaction, and on SQLite the write lock, to the thread's next
    request: the connection is dropped, as the pool's reset on return once ended it."""
    kept = app.extensions["database"]
    taken = _checkouts(app)
    with app.test_request_context():
        database._run(kept, kept.connection(), kept.begin_sql)  # BEGIN, and nothing after it
    assert client.get("/health").status_code == 200
    assert len(taken) == 2  # the next request took another connection
    assert make_tenant("pro")  # a write on another connection is not held up by it
