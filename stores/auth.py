"""API keys of the store server: how a request presents one, how strong one must be, and who may do what.

Two authorities, two keys (DESIGN fact 7: store write access is not admin authority):

* the **store key** (``api_key``) guards every ``/api`` route runners, gateways and apps use: rollouts,
  attempts, spans, rewards, and reading resources;
* the **admin key** (``admin_key``) guards the routes that choose what is served: publishing a resource
  version and activating one (a rollback is either). It must differ from the store key, and the store key
  never opens an admin route (:mod:`agentforge.stores.admin`).

A request presents a key as ``Authorization: Bearer <key>`` (the scheme in any case, RFC 9110 §11.1) or as
``X-Api-Key: <key>``, like the gateway's routes. Keys are compared in constant time.
"""

from __future__ import annotations

import hmac

from agentforge.errors import UserError
from agentforge.loopback import MIN_KEY_LENGTH, bearer_token  # one policy for every agentforge server

__all__ = ["MIN_KEY_LENGTH", "presented_key", "key_matches", "check_keys"]


def presented_key(authorization: str | None, x_api_key: str | None) -> str | None:
    """The key a request presents, or ``None`` when it presents none.

    Args:
        authorization: the ``Authorization`` header: ``Bearer <key>`` (scheme case-insensitive).
        x_api_key: the ``X-Api-Key`` header; it wins when both are sent.

    Returns:
        The key text, stripped of surrounding blanks; ``None`` for no header or an empty one. An
        ``Authorization`` header of another scheme (``Basic ...``) presents no key.
    """
    if x_api_key is not None and x_api_key.strip():
        return x_api_key.strip()
    return bearer_token(authorization) or None


def key_matches(given: str | None, expected: str) -> bool:
    """Constant-time comparison of a presented key with the configured one (``None`` never matches)."""
    if given is None:
        return False
    return hmac.compare_digest(
        given.encode("utf-8", "surrogatepass"), expected.encode("utf-8", "surrogatepass")
    )


def check_keys(api_key: str | None, admin_key: str | None) -> None:
    """Refuse weak or shared keys when a server is built.

    Args:
        api_key: the store key, or ``None`` (then only loopback clients are served).
        admin_key: the admin key, or ``None`` (then the admin routes are closed).

    Raises:
        UserError: a key shorter than :data:`MIN_KEY_LENGTH` characters, empty or blank, or the admin key
            equal to the store key; the message names the key and how to make a good one.
    """
    for name, key in (("api_key", api_key), ("admin_key", admin_key)):
        if key is not None and len(key.strip()) < MIN_KEY_LENGTH:
            raise UserError(
                f"{name} has {len(key.strip())} characters; a store server key needs at least "
                f"{MIN_KEY_LENGTH} (make one with: python -c 'import secrets; print(secrets.token_urlsafe(24))')"
            )
    if api_key is not None and admin_key is not None and key_matches(admin_key, api_key):
        raise UserError(
            "admin_key equals api_key; the admin key (publish/activate resources) must differ from the store "
            "key every runner and gateway holds"
        )
