"""REDIS_URL=redis+sentinel://: a master, a replica and a sentinel of the test's own. The bucket
keeps working across a failover: 503s only while no master answers, then the same bucket on the
promoted replica, with no token created from nothing."""
import json
import shutil
import subprocess
import time

import pytest
import redis
import requests

from tests.servers import free_port

REDIS_SERVER = shutil.which("redis-server")
SERVICE = "intentgate"
CAPACITY, REFILL_PER_MINUTE = 20, 6  # one token per 10 s: none while the failover lasts
LATE_OUTAGE_SECONDS = 5


def _wait(check, seconds=30, what="redis"):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except redis.RedisError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not come up")


@pytest.fixture
def sentinel_set(tmp_path):
    if REDIS_SERVER is None:
        pytest.skip("the Sentinel test needs redis-server (Debian's redis-server and "
                    "redis-sentinel packages)")
    master, replica, sentinel = free_port(), free_port(), free_port()
    # Files (the replication's RDB) in the test's own directory, never the working tree.
    common = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(tmp_path)]
    processes = {
        "master": subprocess.Popen([REDIS_SERVER, "--port", str(master), *common],
                                   stdout=subprocess.DEVNULL),
        "replica": subprocess.Popen([REDIS_SERVER, "--port", str(replica), *common,
                                     "--replicaof", "127.0.0.1", str(master)],
                                    stdout=subprocess.DEVNULL),
    }
    replica_client = redis.Redis(port=replica)
    _wait(lambda: replica_client.info("replication")["master_link_status"] == "up")
    config = tmp_path / "sentinel.conf"
    config.write_text(
        f"port {sentinel}\nbind 127.0.0.1\ndir {tmp_path}\n"
        f"sentinel monitor {SERVICE} 127.0.0.1 {master} 1\n"
        f"sentinel down-after-milliseconds {SERVICE} 500\n"
        f"sentinel failover-timeout {SERVICE} 5000\n")
    processes["sentinel"] = subprocess.Popen([REDIS_SERVER, str(config), "--sentinel"],
                                             stdout=subprocess.DEVNULL)
    sentinel_client = redis.Redis(port=sentinel)
    _wait(lambda: sentinel_client.sentinel_master(SERVICE)["num-slaves"] >= 1, what="sentinel")
    yield {"url": f"redis+sentinel://127.0.0.1:{sentinel}/{SERVICE}", "master": master,
           "replica": replica, "processes": processes}
    for process in processes.values():
        process.kill()
        process.wait()


def test_the_bucket_survives_a_sentinel_failover(embedded_gunicorn, sentinel_set):
    start, cli = embedded_gunicorn
    created = json.loads(cli("tenants", "create", "--email", "sentinel@example.com", "--plan",
                             "pro", "--json"))
    server = start(workers=2, threads=2, REDIS_URL=sentinel_set["url"], REDIS_SOCKET_TIMEOUT=0.3,
                   RATE_LIMIT_CAPACITY=CAPACITY, RATE_LIMIT_REFILL_PER_MINUTE=REFILL_PER_MINUTE)
    headers = {"X-Service-Key": created["api_key"]}
    started = time.monotonic()

    def usage():
        return requests.get(server.url + "/v1/tenant/usage", headers=headers, timeout=30)

    assert [usage().status_code for _ in range(10)] == [200] * 10
    # Every write the master acknowledged has reached the replica (replication is asynchronous:
    # what has not would be lost with the master, as with any Redis failover).
    assert redis.Redis(port=sentinel_set["master"]).wait(1, 5000) == 1

    sentinel_set["processes"]["master"].kill()
    sentinel_set["processes"]["master"].wait()
    answers = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        response = usage()
        answers.append(response.status_code)
        if response.status_code == 503:
            assert response.json()["error"] == "rate limit store unavailable"
        elif response.status_code == 200:
            break
        time.sleep(0.05)
    assert answers[-1] == 200, answers
    outage = answers[:-1]
    print(f"{len(outage)} answers were 503 while the failover lasted")
    assert set(outage) <= {503}  # the outage answer, nothing else, and it ended
    promoted = redis.Redis(port=sentinel_set["replica"]).info("replication")["role"]
    assert promoted == "master"

    # The same bucket on the promoted replica, for every worker (the other worker may still
    # answer 503 for its breaker's second or its own rediscovery): the tokens spent before are
    # still spent, and none was made from nothing.
    # That worker's outage is bounded in time, not in answers (they come back in milliseconds):
    # a breaker's second for each stale connection in its pool (two threads), then rediscovery.
    served, recovered, outage_ended = 10 + 1, time.monotonic(), time.monotonic()
    while time.monotonic() < deadline:
        status = usage().status_code
        if status == 429:
            break
        assert status in (200, 503)
        served += status == 200
        if status == 503:
            outage_ended = time.monotonic()
    print(f"the last 503 came {outage_ended - recovered:.2f} s after the first 200")
    assert status == 429 and outage_ended - recovered <= LATE_OUTAGE_SECONDS
    refilled = (time.monotonic() - started) * REFILL_PER_MINUTE / 60
    assert CAPACITY <= served <= CAPACITY + int(refilled) + 1
