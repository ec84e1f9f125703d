"""The token bucket and the failed-authentication limit on a Redis Cluster, through real
gunicorn workers: exact while every master answers, and when one master stops, its slots'
callers get the outage answer while the others keep their exact buckets."""
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from redis.crc import key_slot

from app import create_app
from app.config import ConfigError, redis_cluster_nodes
from tests.scale_out import REDIS_CLI, REDIS_SERVER, RedisClusterProcesses

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
