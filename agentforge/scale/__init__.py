"""Past one process: gateway replicas behind a load balancer (HAProxy), wired, never reimplemented.

* :mod:`agentforge.scale.haproxy`: the load balancer's config (a rollout's calls on one replica, by consistent
  hashing of its id in the URL) and HAProxy as a child process.
"""

from agentforge.scale.haproxy import HAProxy, find_haproxy, haproxy_config

__all__ = ["HAProxy", "find_haproxy", "haproxy_config"]
