"""The ``PolicyServer`` protocol, kept under its first import path.

The contract of an inference engine that serves a base model plus LoRA adapters lives with the other
ports in :mod:`agentforge.ports`; new code imports it from there.
"""

from agentforge.ports import PolicyServer

__all__ = ["PolicyServer"]
