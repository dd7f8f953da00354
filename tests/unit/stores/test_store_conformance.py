"""Runs the store conformance suite (``store_conformance.py``) against every backend of the ``store``
fixture: SQLite file, in-memory SQLite, HTTP (uvicorn + SQLite) and PostgreSQL (when configured)."""

from __future__ import annotations

import store_conformance
from store_conformance import (  # noqa: F401  (collected by pytest from this module)
    test_a_final_reward_after_training_is_kept_but_never_replaces_the_training_reward,
    test_add_span_and_reward_are_idempotent,
    test_claim_is_atomic_across_threads,
    test_claim_order_and_agent_filter,
    test_close_is_safe_twice,
    test_concurrent_add_span_calls_share_commits_and_lose_nothing,
    test_enqueue_is_idempotent_and_forces_queued,
    test_final_reward_is_last_by_sequence,
    test_happy_path_and_invalid_transitions,
    test_huge_mixed_unicode_payloads_round_trip_exactly,
    test_ids_must_fit_a_url_path_segment,
    test_implements_protocol,
    test_late_spans_are_quarantined_and_never_valid,
    test_leaving_running_by_update_closes_the_attempt,
    test_list_rollouts_filters,
    test_none_and_nan_rewards_are_stored_invalid,
    test_page_rollouts_filters_and_keyset_pages,
    test_requeue_stale,
    test_resource_versions_publish_activate_rollback,
    test_retries_until_attempts_run_out,
    test_reward_attaches_to_the_latest_span_before_it,
    test_span_attempt_must_belong_to_rollout,
    test_span_listings_read_in_keyset_pages,
    test_spans_ordering_kinds_and_orphans,
    test_submit_many_acknowledges_a_flush_once_all_is_committed,
    test_tenant_is_stored_and_scopes_rollout_and_span_queries,
    test_unknown_ids_raise_not_found,
    test_unstorable_scalar_text_is_rejected_clearly,
    test_update_rollout_fields,
    test_valid_only_keeps_the_counted_attempt,
    test_write_batch_keeps_order_isolates_bad_items_and_dedupes,
)


def test_every_suite_test_is_collected_here() -> None:
    suite = {name for name in vars(store_conformance) if name.startswith("test_")}
    assert suite <= set(globals()), f"import these from store_conformance: {sorted(suite - set(globals()))}"
