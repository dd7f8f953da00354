"""τ-bench retail domain (v1): the database, its 16 tools, and the tasks.

Typical use, one database view per rollout::

    env = load_tau_retail()               # once per process
    db = env.new_db()                     # per rollout: private, copy-on-write
    out = db.call_tool("get_order_details", {"order_id": "#W2378156"})
    db.db_hash()                          # sha256 of json.dumps(data, sort_keys=True)

Score a finished rollout with :func:`agentforge.agents.customer_service.rewards.tau_reward`.
"""

from agentforge.agents.customer_service.tau_retail.db import TABLES, RetailData, RetailDB, canonical_hash
from agentforge.agents.customer_service.tau_retail.loader import (
    DATASET,
    SPLITS,
    TauRetail,
    load_tau_retail,
    load_tau_tasks,
)
from agentforge.agents.customer_service.tau_retail.tools import (
    READ_TOOLS,
    TOOLS,
    WRITE_TOOLS,
    calculate_expression,
    call_tool,
    tool_schemas,
)

__all__ = [
    "DATASET",
    "READ_TOOLS",
    "SPLITS",
    "TABLES",
    "TOOLS",
    "WRITE_TOOLS",
    "RetailData",
    "RetailDB",
    "TauRetail",
    "calculate_expression",
    "call_tool",
    "canonical_hash",
    "load_tau_retail",
    "load_tau_tasks",
    "tool_schemas",
]
