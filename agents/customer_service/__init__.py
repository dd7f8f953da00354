"""Customer-service agents: the triage graph (:mod:`.triage`), the τ-retail domain (:mod:`.tau_retail`) and
the intent data sets (:mod:`.datasets`).

Importing this package reads no data; loaders read ``../shared/data`` (or ``$AGENTFORGE_DATA_DIR``) on call.
"""
