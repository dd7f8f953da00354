"""Customer-service agents: the triage graph (:mod:`.triage`), the τ-retail domain (:mod:`.tau_retail`), the
intent data sets (:mod:`.datasets`), and the τ-retail customer-service agent:

* :mod:`.cs_graph` — the LangGraph agent (triage → retrieval → LLM with tools ⇄ tool execution);
* :mod:`.prompts` — the versioned system prompt (``prompt:cs-system``), tool subsets, worked example;
* :mod:`.knowledge` / :mod:`.memory` / :mod:`.embeddings` — policy retrieval and conversation memories in
  ChromaDB with offline embeddings;
* :mod:`.user_sim` — the simulated customer; :mod:`.episode` — episodes, scoring, the runtime agent.

Importing this package reads no data and imports neither LangGraph, chromadb nor torch; loaders read
``../shared/data`` (or ``$AGENTFORGE_DATA_DIR``) on call.
"""
