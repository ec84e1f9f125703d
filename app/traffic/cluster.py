"""The rate-limit store on a Redis Cluster: limits' own storage, with its client made on first
use, registered with `limits` under the scheme `intentgate+redis+cluster://` (app.traffic.limits
gives it the redis+cluster:// REDIS_URL).

redis-py's cluster client connects to its startup nodes as it is made. limits makes it when the
app is made, so a cluster that did not answer then failed every worker's boot, and gunicorn
stopped: a host was gone at its next worker recycle. A single Redis or a Sentinel's master that
does not answer is an outage like any other (the failure policy, /health 503, the breaker asking
once a second: app.traffic.strategy); so is a cluster now, until a call finds it answering.
"""
import threading

import redis
from limits.storage import RedisClusterStorage
from limits.storage.redis import RedisStorage
from redis.exceptions import RedisClusterException

SCHEME = "intentgate+redis+cluster"
URL_SCHEME = "redis+cluster"


def storage_uri(redis_url):
    """The limiter's storage URI for a redis+cluster:// REDIS_URL."""
    return SCHEME + redis_url[len(URL_SCHEME):]


class ClusterStorage(RedisClusterStorage):
    STORAGE_SCHEME = [SCHEME]

    def __init__(self, uri, key_prefix=RedisStorage.PREFIX, wrap_exceptions=False, **options):
        self._making = threading.Lock()
        self._arguments = (URL_SCHEME + uri[len(SCHEME):], key_prefix, wrap_exceptions, options)
        try:
            self._make()
        except RedisClusterException:
            # Not answering now: the first call that finds it answering makes the client. What
            # limits set before the client (key_prefix, the redis module) is set; storage None.
            super(RedisStorage, self).__init__(uri, wrap_exceptions, **options)

    def _make(self):
        uri, key_prefix, wrap_exceptions, options = self._arguments
        try:
            RedisClusterStorage.__init__(self, uri, key_prefix, wrap_exceptions, **options)
        except (IndexError, KeyError) as exc:
            # Nodes that answer but hold no slots yet (a cluster not yet created): redis-py's
            # NodesManager fails to find a master with an IndexError. Not answering, as above.
            self.storage = None
            raise RedisClusterException("the cluster's nodes serve no slots") from exc

    def get_connection(self, readonly=False):
        if self.storage is None:
            with self._making:
                if self.storage is None:
                    self._make()  # RedisClusterException while the cluster does not answer
        return self.storage

    @property
    def base_exceptions(self):
        # A client that cannot be made fails as the store does, not as a bug (a 500).
        return (redis.RedisError, RedisClusterException)
