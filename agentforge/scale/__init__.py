"""Past one process: gateway replicas behind a load balancer (HAProxy), wired, never reimplemented.

* :mod:`agentforge.scale.haproxy`: the load balancer's config (a rollout's calls on one replica, by consistent
  hashing of its id in the URL) and HAProxy as a child process.
* :mod:`agentforge.scale.replicas`: ``agentforge serve --workers N``, N ``serve`` processes behind HAProxy.
"""

from agentforge.scale.haproxy import HAProxy, find_haproxy, haproxy_config
from agentforge.scale.replicas import ServeReplicas, replica_ids

__all__ = ["HAProxy", "ServeReplicas", "find_haproxy", "haproxy_config", "replica_ids"]
