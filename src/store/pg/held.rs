//! Held sessions on PostgreSQL (see [`crate::store::held`]): table `taskgate_held_sessions`
//! (migration 3), one autocommitted statement per change, so a held session written on one
//! replica is served by every replica sharing the store.

use super::{ms, pg_err, PgStore};
use crate::store::{HeldSessionRecord, HeldSessionStore, StoreError};

impl PgStore {
    pub(super) async fn put_held_now(
        c: super::Conn,
        session: HeldSessionRecord,
    ) -> Result<(), StoreError> {
        session.check().map_err(StoreError::TooLarge)?;
        let text = session.encode();
        c.execute(
            "INSERT INTO taskgate_held_sessions (upstream, session_id, expires_at, session) \
             VALUES ($1, $2, $3, $4) ON CONFLICT (upstream, session_id) \
             DO UPDATE SET expires_at = EXCLUDED.expires_at, session = EXCLUDED.session",
            &[
                &session.upstream,
                &session.session_id,
                &ms(session.expires_at),
                &text,
            ],
        )
        .await
        .map_err(pg_err)?;
        Ok(())
    }
}

impl HeldSessionStore for PgStore {
    /// Committed (durable) on return: PostgreSQL's `sync()` has nothing left to wait for.
    fn put_held_session(&self, session: HeldSessionRecord) -> Result<(), StoreError> {
        self.run(move |c| PgStore::put_held_now(c, session))
    }

    fn held_session(
        &self,
        upstream: &str,
        session: &str,
    ) -> Result<Option<HeldSessionRecord>, StoreError> {
        let (up, id) = (upstream.to_string(), session.to_string());
        let row = self.run(|c| async move {
            c.query_opt(
                "SELECT session, expires_at FROM taskgate_held_sessions \
                 WHERE upstream = $1 AND session_id = $2",
                &[&up, &id],
            )
            .await
            .map_err(pg_err)
        })?;
        let Some(row) = row else {
            return Ok(None);
        };
        let text: &str = row.get(0);
        let mut session = HeldSessionRecord::decode(text.as_bytes())?;
        // The column is what touches move.
        session.expires_at = u64::try_from(row.get::<_, i64>(1)).unwrap_or(0);
        Ok(Some(session))
    }

    fn touch_held_session(
        &self,
        upstream: &str,
        session: &str,
        expires_at: u64,
    ) -> Result<bool, StoreError> {
        let (up, id) = (upstream.to_string(), session.to_string());
        let n = self.run(move |c| async move {
            c.execute(
                "UPDATE taskgate_held_sessions SET expires_at = GREATEST(expires_at, $3) \
                 WHERE upstream = $1 AND session_id = $2",
                &[&up, &id, &ms(expires_at)],
            )
            .await
            .map_err(pg_err)
        })?;
        Ok(n > 0)
    }

    fn remove_held_session(&self, upstream: &str, session: &str) -> Result<bool, StoreError> {
        let (up, id) = (upstream.to_string(), session.to_string());
        let n = self.run(move |c| async move {
            c.execute(
                "DELETE FROM taskgate_held_sessions WHERE upstream = $1 AND session_id = $2",
                &[&up, &id],
            )
            .await
            .map_err(pg_err)
        })?;
        Ok(n > 0)
    }

    fn remove_expired_held_sessions(&self, now_ms: u64, limit: usize) -> Result<usize, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let n = self.run(move |c| async move {
            c.execute(
                "DELETE FROM taskgate_held_sessions WHERE (upstream, session_id) IN \
                 (SELECT upstream, session_id FROM taskgate_held_sessions \
                  WHERE expires_at <= $1 ORDER BY expires_at LIMIT $2)",
                &[&ms(now_ms), &limit],
            )
            .await
            .map_err(pg_err)
        })?;
        Ok(usize::try_from(n).unwrap_or(usize::MAX))
    }
}
