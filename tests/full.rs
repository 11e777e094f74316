//! Tier 2, "full": the integration tests that need the world around taskgate: a PostgreSQL
//! (`source tests/pg/cluster.sh` exports `TASKGATE_TEST_DATABASE_URL`), load balancers (nginx,
//! HAProxy) in front of a tier of replicas, and the real binary killed and restarted in rounds.
//! `tests/run-all.sh` runs it with everything it needs; without a PostgreSQL its PostgreSQL tests
//! skip (unless `TASKGATE_REQUIRE_PG=1`).

mod common;

mod cli;
mod cli_logs;
mod durability;
mod store_contract;
mod store_unanswered;
mod store_unreachable;
mod tier;
mod tier_cancel_lease;
mod tier_cancel_takeover;
mod tier_final_write;
mod tier_get_stream;
mod tier_leases;
mod tier_oauth;
mod tier_reverse_input;
mod tier_session_ids;
mod tier_sessions;
mod tier_store_outage;
