"""The token bucket and the failed-authentication limit on a Redis Cluster, through real
gunicorn workers: exact while every master answers, and when one master stops, its slots'
callers get the outage answer while the others keep their exact buckets."""
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from redis.crc import key_slot

from app import create_app
from app.config import ConfigError, redis_cluster_nodes
from tests.conftest import ENCRYPTION_KEY, TEST_DATABASE_URL
from tests.scale_out import REDIS_CLI, REDIS_SERVER, RedisClusterProcesses
from tests.servers import GunicornServer, free_port

CAPACITY = 20
# No token refills while a burst lasts (one per 10 s); failures: 5 at once.
SETTINGS = {"RATE_LIMIT_CAPACITY": CAPACITY, "RATE_LIMIT_REFILL_PER_MINUTE": 6,
            "AUTH_FAILURE_LIMIT": "5 per minute", "RATE_LIMIT_STORE_FAILURE": "closed"}


@pytest.fixture
def cluster(tmp_path):
    """A cluster of this test's own: the test stops one of its masters."""
    if REDIS_SERVER is None or REDIS_CLI is None:
        pytest.skip("the Redis Cluster tests need redis-server and redis-cli")
    processes = RedisClusterProcesses(tmp_path / "cluster").start()
    yield processes
    processes.stop()


def _slot(owner):
    return key_slot(f"{{{owner}}}".encode())  # the hash tag of the bucket's key


def _statuses(server, headers, count):
    def call(_):
        answer = requests.get(server.url + "/v1/tenant/usage", headers=headers, timeout=30)
        return answer.status_code, answer.json().get("error")

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(call, range(count)))


def test_buckets_on_a_cluster_stay_exact_and_a_lost_master_takes_only_its_slots(
        gunicorn, make_tenant, cluster):
    server = gunicorn(workers=2, REDIS_URL=cluster.url, **SETTINGS)
    tenants = [make_tenant("pro")]
    victim_port = cluster.owner_of(_slot(f"tenant:{tenants[0].tenant_id}"))
    for _ in range(60):  # tenant ids are sequential: two more off the victim come quickly
        if sum(cluster.owner_of(_slot(f"tenant:{t.tenant_id}")) != victim_port
               for t in tenants) >= 2:
            break
        tenants.append(make_tenant("pro"))
    victim = tenants[0]
    survivor, fresh = [t for t in tenants
                       if cluster.owner_of(_slot(f"tenant:{t.tenant_id}")) != victim_port][:2]

    for tenant in (victim, survivor):
        statuses = [status for status, _ in _statuses(server, tenant.headers, CAPACITY + 10)]
        assert (statuses.count(200), statuses.count(429)) == (CAPACITY, 10)
    wrong = {"X-Service-Key": "key_live_" + "0" * 48}
    failures = [status for status, _ in _statuses(server, wrong, 8)]
    assert (failures.count(401), failures.count(429)) == (5, 3)

    cluster.kill(victim_port)

    assert set(_statuses(server, victim.headers, 10)) == {
        (503, "rate limit store unavailable")}
    assert set(_statuses(server, survivor.headers, 10)) == {(429, "rate limit exceeded")}
    remaining = []
    for _ in range(5):
        answer = requests.get(server.url + "/v1/tenant/usage", headers=fresh.headers, timeout=30)
        assert answer.status_code == 200, answer.text
        remaining.append(int(answer.headers["X-RateLimit-Remaining"]))
    assert remaining == list(range(CAPACITY - 1, CAPACITY - 6, -1))
    health = requests.get(server.url + "/health", timeout=30)
    assert health.status_code == 503
    assert health.json()["checks"] == {"database": "ok", "rate_limit_store": "unavailable"}


def _wait_until(condition, timeout=30):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not within 30 s"
        time.sleep(0.2)


def _health(server):
    answer = requests.get(server.url + "/health", timeout=30)
    return answer.status_code, answer.json()["checks"]["rate_limit_store"]


def test_a_host_starts_while_its_cluster_does_not_answer_and_serves_once_it_does(
        migrated, make_tenant, tmp_path, leak_watch):
    """redis-py's cluster client connects to its startup nodes as it is made. Made with the
    app, a cluster that did not answer failed every worker's boot, and gunicorn stopped (a host
    gone at its next worker recycle). Now it is an outage like a single Redis's: 503, /health
    503, until the cluster answers."""
    if not TEST_DATABASE_URL:
        pytest.skip("multi-process tests need PostgreSQL: set TEST_DATABASE_URL")
    if REDIS_SERVER is None or REDIS_CLI is None:
        pytest.skip("the Redis Cluster tests need redis-server and redis-cli")
    cluster = RedisClusterProcesses(tmp_path / "cluster")  # its ports chosen, nothing started
    server = GunicornServer(tmp_path / "gunicorn.log", {
        "DATABASE_URL": TEST_DATABASE_URL, "SECRET_ENCRYPTION_KEY": ENCRYPTION_KEY,
        "REDIS_URL": cluster.url, **{key: str(value) for key, value in SETTINGS.items()}},
        workers=2)
    try:
        server.start(serving=(503,))
        tenant = make_tenant("pro")
        assert _health(server) == (503, "unavailable")
        assert set(_statuses(server, tenant.headers, 4)) == {
            (503, "rate limit store unavailable")}
        # Its nodes answer before the cluster is made, and serve no slot: still the outage
        # (redis-py's client then failed with an IndexError: 500s, and a breaker's thread
        # ended, leaving its worker's /health at 503 for good).
        cluster.start_nodes()
        time.sleep(2.5)  # each worker's breaker asks the slotless nodes at least twice
        assert set(_statuses(server, tenant.headers, 6)) == {
            (503, "rate limit store unavailable")}
        cluster.create()
        # Each worker's breaker asks once a second whether the store answers.
        _wait_until(lambda: set(_statuses(server, tenant.headers, 4)) == {(200, None)})
        _wait_until(lambda: {_health(server) for _ in range(6)} == {(200, "ok")})
    finally:
        server.stop()
        cluster.stop()
    log = server.log_path.read_text(errors="replace")
    assert leak_watch.leaks_in(log) == []
    assert "Traceback" not in log and '"status": 500' not in log


def test_a_generate_while_no_node_of_the_cluster_answers_is_the_outage_answer(request,
                                                                              settings):
    """A worker whose breaker is still closed: generate reads the principal kept in Redis
    first (app.tenants.key_cache), and a cluster client that cannot be made is the store's
    outage (503, the breaker opened), not a 500."""
    if not TEST_DATABASE_URL:
        pytest.skip("principals are kept in Redis where PostgreSQL confirms them")
    settings["REDIS_URL"] = f"redis+cluster://127.0.0.1:{free_port()}"
    client, tenant = request.getfixturevalue("client"), request.getfixturevalue("tenant")
    answer = client.post("/v1/intent/generate", headers=tenant.headers,
                         json={"user_token": "cluster-user-token"})
    assert (answer.status_code, answer.get_json()["error"]) == (
        503, "rate limit store unavailable")


def test_health_is_503_while_a_master_is_down_before_any_request_met_it(gunicorn, cluster):
    """/health pings every master: a worker whose requests never touched the dead master's
    slots says so too (a PING of the cluster client's default node alone said ok)."""
    server = gunicorn(workers=2, REDIS_URL=cluster.url, **SETTINGS)
    assert _health(server) == (200, "ok")
    cluster.kill(cluster.ports[-1])
    assert {_health(server) for _ in range(6)} == {(503, "unavailable")}


TIMEOUT = 1.5  # REDIS_SOCKET_TIMEOUT of the tests with a frozen master


def _usage_while_its_master_is_frozen(gunicorn, make_tenant, cluster, health_first=False):
    """A usage request of a tenant whose bucket a frozen master holds, to one fresh worker
    (after a /health, which answers 503, when `health_first`): (answer, seconds it took)."""
    server = gunicorn(workers=1, REDIS_URL=cluster.url, REDIS_SOCKET_TIMEOUT=TIMEOUT,
                      **SETTINGS)
    # One worker of one host: run as several hosts, /health and the request would each go to
    # another host's worker, as a load balancer's would.
    server = getattr(server, "servers", [server])[0]
    frozen = cluster.ports[-1]  # not the first startup node, which the client asks after
    tenant = make_tenant("pro")
    while cluster.owner_of(_slot(f"tenant:{tenant.tenant_id}")) != frozen:
        tenant = make_tenant("pro")
    cluster.processes[frozen].send_signal(signal.SIGSTOP)
    try:
        if health_first:
            assert _health(server) == (503, "unavailable")
        started = time.monotonic()
        answer = requests.get(server.url + "/v1/tenant/usage", headers=tenant.headers,
                              timeout=30)
        return answer, time.monotonic() - started
    finally:
        cluster.processes[frozen].send_signal(signal.SIGCONT)


def test_a_master_that_does_not_answer_costs_one_timeout_not_three(gunicorn, make_tenant,
                                                                    cluster):
    """A frozen master: the request whose bucket it holds waits one REDIS_SOCKET_TIMEOUT, then
    gets the outage answer. The cluster client retried a timeout twice (1.5 s at 0.5 s)."""
    answer, waited = _usage_while_its_master_is_frozen(gunicorn, make_tenant, cluster)
    assert (answer.status_code, answer.json()["error"]) == (503, "rate limit store unavailable")
    assert waited < 2 * TIMEOUT, f"{waited:.2f} s: more than one timeout"


def test_a_master_health_found_frozen_is_not_waited_for_again_by_a_request(
        gunicorn, make_tenant, cluster):
    """A fresh worker's /health meets a frozen master first: it opens that master's breaker,
    so the request whose bucket the master holds is answered at once, not after a second
    timeout (before, /health opened only the worker's general breaker)."""
    answer, waited = _usage_while_its_master_is_frozen(gunicorn, make_tenant, cluster,
                                                       health_first=True)
    assert (answer.status_code, answer.json()["error"]) == (503, "rate limit store unavailable")
    assert waited < TIMEOUT, f"{waited:.2f} s: a second timeout"


@pytest.mark.parametrize("url, nodes", [
    ("redis+cluster://127.0.0.1:7101", [("127.0.0.1", 7101)]),
    ("redis+cluster://10.0.0.1:7101,10.0.0.2:7102/", [("10.0.0.1", 7101), ("10.0.0.2", 7102)]),
])
def test_a_cluster_url_names_its_startup_nodes(url, nodes):
    assert redis_cluster_nodes(url) == nodes


@pytest.mark.parametrize("url", ["redis+cluster://", "redis+cluster://127.0.0.1",
                                 "redis+cluster://127.0.0.1:http", "redis+cluster://h:1,",
                                 "redis+cluster://h:70000", "redis+cluster://user@h:7101",
                                 "redis+cluster://h:7101/0"])
def test_a_malformed_cluster_url_stops_start_up(settings, url):
    with pytest.raises(ConfigError, match="redis\\+cluster://host:port"):
        create_app({**settings, "REDIS_URL": url})
