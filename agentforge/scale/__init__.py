"""Past one process: gateway replicas behind a load balancer (HAProxy), wired, never reimplemented.

* :mod:`agentforge.scale.haproxy`: the load balancer's config (a rollout's calls on one replica, by consistent
  hashing of its id in the URL) and HAProxy as a child process.
* :mod:`agentforge.scale.replicas`: ``agentforge serve --workers N``, N ``serve`` processes behind HAProxy.
* :mod:`agentforge.scale.pool`: ``agentforge serve --engines N``, N engines behind one policy (every version
  loaded into each; the router sends a rollout's calls to one of them).
"""

from agentforge.scale.haproxy import HAProxy, find_haproxy, haproxy_config
from agentforge.scale.pool import EnginePool, PoolMember, core_share
from agentforge.scale.replicas import ServeReplicas, replica_ids

__all__ = [
    "EnginePool",
    "HAProxy",
    "PoolMember",
    "ServeReplicas",
    "core_share",
    "find_haproxy",
    "haproxy_config",
    "replica_ids",
]
