"""Privacy by construction (DESIGN fact 9): personal data and secrets are masked in flight before the engine
sees them (stored ids stay token-exact and trainable) or redacted at rest with their ids withheld.

* :mod:`~agentforge.privacy.config`: the policy (:class:`PrivacyConfig`, :class:`PrivacyMode`);
* :mod:`~agentforge.privacy.detect`: the offline detectors (Presidio pattern recognizers, phonenumbers,
  detect-secrets, deployment patterns);
* :mod:`~agentforge.privacy.mapping`: a rollout's placeholders (memory only);
* :mod:`~agentforge.privacy.flight`: the gateway's hook (:class:`PrivacyGuard`).

Importing this package loads none of the detector libraries; building a :class:`Detector` does.
"""

from agentforge.privacy.config import CATEGORIES, PrivacyConfig, PrivacyMode
from agentforge.privacy.detect import Detector, Finding
from agentforge.privacy.flight import REDACTED_FLAG, CallPrivacy, PrivacyGuard
from agentforge.privacy.mapping import Mapping

__all__ = [
    "CATEGORIES",
    "PrivacyConfig",
    "PrivacyMode",
    "Detector",
    "Finding",
    "Mapping",
    "PrivacyGuard",
    "CallPrivacy",
    "REDACTED_FLAG",
]
