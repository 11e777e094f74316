//! The sled store's held sessions (see [`crate::store::held`]): tree `held_sessions`
//! (`(upstream, Mcp-Session-Id)` → JSON [`HeldSessionRecord`]) and its expiry index
//! `held_by_expiry` (`(expires_at, upstream, Mcp-Session-Id)` → `()`), changed together in one
//! transaction.

use super::{db_err, push_str, read_str, read_u64, task_key, SledStore};
use crate::store::{HeldSessionRecord, HeldSessionStore, StoreError, TaskStore};
use sled::transaction::{ConflictableTransactionError, TransactionError};
use sled::Transactional;

/// `held_by_expiry` key: `(expires_at, upstream, Mcp-Session-Id)`, sorting by `expires_at`.
pub(crate) fn expiry_key(expires_at: u64, upstream: &str, session: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(16 + upstream.len() + session.len());
    k.extend_from_slice(&expires_at.to_be_bytes());
    push_str(&mut k, upstream);
    push_str(&mut k, session);
    k
}

/// The `(expires_at, upstream, Mcp-Session-Id)` of an [`expiry_key`]; `None` when `key` is
/// too short for them or a string is not UTF-8.
pub(crate) fn read_expiry_key(key: &[u8]) -> Option<(u64, &str, &str)> {
    let mut rest = key;
    Some((
        read_u64(&mut rest)?,
        read_str(&mut rest)?,
        read_str(&mut rest)?,
    ))
}

type Tx = Result<Option<HeldSessionRecord>, TransactionError<String>>;

fn tx_err(e: TransactionError<String>) -> StoreError {
    match e {
        TransactionError::Abort(msg) => StoreError::Corrupt(msg),
        TransactionError::Storage(e) => db_err(e),
    }
}

impl SledStore {
    /// Writes `session` and its expiry entry in one transaction (not yet durable).
    fn put_held(&self, session: &HeldSessionRecord) -> Result<(), StoreError> {
        session.check().map_err(StoreError::Db)?;
        let key = task_key(&session.upstream, &session.session_id);
        let text = session.encode();
        let done: Tx = (&self.held, &self.held_by_expiry).transaction(|(h, e)| {
            if let Some(old) = h.insert(key.as_slice(), text.as_bytes())? {
                if let Ok(old) = HeldSessionRecord::decode(&old) {
                    e.remove(expiry_key(old.expires_at, &old.upstream, &old.session_id))?;
                }
            }
            let k = expiry_key(session.expires_at, &session.upstream, &session.session_id);
            e.insert(k, &[][..])?;
            Ok(None)
        });
        done.map(|_| ()).map_err(tx_err)
    }

    /// Applies `change` to a stored held session (`None` from it removes the session).
    fn change_held(
        &self,
        upstream: &str,
        session: &str,
        change: impl Fn(HeldSessionRecord) -> Option<HeldSessionRecord>,
    ) -> Result<bool, StoreError> {
        let key = task_key(upstream, session);
        let done: Tx = (&self.held, &self.held_by_expiry).transaction(|(h, e)| {
            let Some(old) = h.get(&key)? else {
                return Ok(None);
            };
            let old = HeldSessionRecord::decode(&old)
                .map_err(|err| ConflictableTransactionError::Abort(err.to_string()))?;
            e.remove(expiry_key(old.expires_at, upstream, session))?;
            match change(old.clone()) {
                Some(new) => {
                    h.insert(key.as_slice(), new.encode().as_bytes())?;
                    e.insert(expiry_key(new.expires_at, upstream, session), &[][..])?;
                }
                None => {
                    h.remove(key.as_slice())?;
                }
            }
            Ok(Some(old))
        });
        done.map(|old| old.is_some()).map_err(tx_err)
    }
}

impl HeldSessionStore for SledStore {
    /// Writes `session` and its expiry entry (replacing an older version of it); durable with
    /// the next group commit.
    fn put_held_session(&self, session: HeldSessionRecord) -> Result<(), StoreError> {
        self.put_held(&session)
    }

    /// The stored held session.
    fn held_session(
        &self,
        upstream: &str,
        session: &str,
    ) -> Result<Option<HeldSessionRecord>, StoreError> {
        match self.held.get(task_key(upstream, session)).map_err(db_err)? {
            Some(bytes) => HeldSessionRecord::decode(&bytes).map(Some),
            None => Ok(None),
        }
    }

    fn touch_held_session(
        &self,
        upstream: &str,
        session: &str,
        expires_at: u64,
    ) -> Result<bool, StoreError> {
        self.change_held(upstream, session, |mut s| {
            s.expires_at = expires_at;
            Some(s)
        })
    }

    fn remove_held_session(&self, upstream: &str, session: &str) -> Result<bool, StoreError> {
        let removed = self.change_held(upstream, session, |_| None)?;
        self.sync_soon();
        Ok(removed)
    }

    fn remove_expired_held_sessions(&self, now_ms: u64, limit: usize) -> Result<usize, StoreError> {
        let mut keys = Vec::new();
        for item in self
            .held_by_expiry
            .range(..expiry_key(now_ms.saturating_add(1), "", ""))
        {
            let (k, _) = item.map_err(db_err)?;
            if let Some((_, up, id)) = read_expiry_key(&k) {
                keys.push((up.to_string(), id.to_string(), k.clone()));
            }
            if keys.len() >= limit {
                break;
            }
        }
        let mut removed = 0;
        for (up, id, k) in keys {
            // Only a session still expired (a touch may have moved it since the scan).
            let expired = std::cell::Cell::new(false);
            let changed = self.change_held(&up, &id, |s| {
                expired.set(s.expires_at <= now_ms);
                (s.expires_at > now_ms).then_some(s)
            });
            match changed {
                Ok(_) => removed += usize::from(expired.get()),
                // A value that cannot be read back (never written so) would stop every later
                // sweep here: it goes.
                Err(StoreError::Corrupt(_)) => {
                    self.held.remove(task_key(&up, &id)).map_err(db_err)?;
                    removed += 1;
                }
                Err(e) => return Err(e),
            }
            // An index entry without its session (never expected) goes too.
            self.held_by_expiry.remove(k).map_err(db_err)?;
        }
        Ok(removed)
    }
}
