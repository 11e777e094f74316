//! The sled store's held sessions (see [`crate::store::held`]): tree `held_sessions`
//! (`(upstream, Mcp-Session-Id)` → JSON [`HeldSessionRecord`]) and its expiry index
//! `held_by_expiry` (`(expires_at, upstream, Mcp-Session-Id)` → when it was written:
//! `swap::index_value`), changed together as the task records and their index are, without a
//! sled transaction ([`super::swap`]): a session's new expiry entry is written before the
//! session, its old one removed after; a removal swaps the session to nothing, then removes its
//! entry. A crash or a lost race leaves at worst an entry without its session, which the sweep
//! skips and removes once surely not a write in progress (`is_leftover`).

use super::swap::{remove_entry, swap_indexed};
use super::{db_err, is_leftover, push_str, read_str, read_u64, task_key, SledStore};
use crate::mcp::task::now_ms;
use crate::store::{HeldSessionRecord, HeldSessionStore, StoreError, TaskStore};

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

impl SledStore {
    /// Writes `session` and its expiry entry (not yet durable), replacing the stored version:
    /// a compare-and-swap against the version read (retried if another change won meanwhile),
    /// its entry moved as [`SledStore::change_held`] moves it. A stored version that cannot be
    /// read is replaced; its entry, if any, is left to the sweep.
    fn put_held(&self, session: &HeldSessionRecord) -> Result<(), StoreError> {
        session.check().map_err(StoreError::TooLarge)?;
        let key = task_key(&session.upstream, &session.session_id);
        let text = session.encode();
        let new_k = expiry_key(session.expires_at, &session.upstream, &session.session_id);
        let mut old = self.held.get(&key).map_err(db_err)?;
        loop {
            let old_k = old
                .as_deref()
                .and_then(|o| HeldSessionRecord::decode(o).ok())
                .map(|o| expiry_key(o.expires_at, &o.upstream, &o.session_id));
            let same = old_k.as_ref() == Some(&new_k);
            let added: &[_] = if same {
                &[]
            } else {
                &[(&self.held_by_expiry, &*new_k)]
            };
            let dropped = match &old_k {
                Some(k) if !same => vec![(&self.held_by_expiry, &k[..])],
                _ => Vec::new(),
            };
            let swapped = swap_indexed(
                &self.held,
                &key,
                old.as_deref(),
                Some(text.as_bytes()),
                added,
                &dropped,
                now_ms(),
            )?;
            match swapped {
                Ok(()) => return Ok(()),
                Err(current) => old = current,
            }
        }
    }

    /// Applies `change` to a stored held session (`None` from it removes the session): a
    /// compare-and-swap against the version read, retried on the version stored then if another
    /// change won meanwhile (`change` runs again); the expiry entry moves with the session (see
    /// the module doc). Whether a session was stored; [`StoreError::Corrupt`] (nothing changed)
    /// for one that cannot be read.
    fn change_held(
        &self,
        upstream: &str,
        session: &str,
        change: impl Fn(HeldSessionRecord) -> Option<HeldSessionRecord>,
    ) -> Result<bool, StoreError> {
        let key = task_key(upstream, session);
        let Some(mut raw) = self.held.get(&key).map_err(db_err)? else {
            return Ok(false);
        };
        loop {
            let old = HeldSessionRecord::decode(&raw)?;
            let old_k = expiry_key(old.expires_at, upstream, session);
            let swapped = match change(old) {
                Some(new) => {
                    let text = new.encode();
                    if text.as_bytes() == &raw[..] {
                        return Ok(true);
                    }
                    let new_k = expiry_key(new.expires_at, upstream, session);
                    let new = Some(text.as_bytes());
                    if new_k == old_k {
                        swap_indexed(&self.held, &key, Some(&raw), new, &[], &[], 0)?
                    } else {
                        let added = [(&self.held_by_expiry, &*new_k)];
                        let dropped = [(&self.held_by_expiry, &*old_k)];
                        let at = now_ms();
                        swap_indexed(&self.held, &key, Some(&raw), new, &added, &dropped, at)?
                    }
                }
                None => {
                    let dropped = [(&self.held_by_expiry, &*old_k)];
                    swap_indexed(&self.held, &key, Some(&raw), None, &[], &dropped, 0)?
                }
            };
            match swapped {
                Ok(()) => return Ok(true),
                Err(Some(current)) => raw = current,
                Err(None) => return Ok(false),
            }
        }
    }
}

impl HeldSessionStore for SledStore {
    /// Writes `session` and its expiry entry (replacing an older version of it); durable with
    /// the next group commit.
    fn put_held_session(&self, session: HeldSessionRecord) -> Result<(), StoreError> {
        self.failed.guard(|| self.put_held(&session))
    }

    /// The stored held session.
    fn held_session(
        &self,
        upstream: &str,
        session: &str,
    ) -> Result<Option<HeldSessionRecord>, StoreError> {
        self.failed.guard(
            || match self.held.get(task_key(upstream, session)).map_err(db_err)? {
                Some(bytes) => HeldSessionRecord::decode(&bytes).map(Some),
                None => Ok(None),
            },
        )
    }

    fn touch_held_session(
        &self,
        upstream: &str,
        session: &str,
        expires_at: u64,
    ) -> Result<bool, StoreError> {
        self.failed.guard(|| {
            // Forward only (the trait's doc): an expiry that came back to a value it had would
            // break `swap`'s rule for removing index entries.
            self.change_held(upstream, session, |mut s| {
                s.expires_at = s.expires_at.max(expires_at);
                Some(s)
            })
        })
    }

    fn remove_held_session(&self, upstream: &str, session: &str) -> Result<bool, StoreError> {
        self.failed.guard(|| {
            let removed = self.change_held(upstream, session, |_| None)?;
            self.sync_soon();
            Ok(removed)
        })
    }

    fn remove_expired_held_sessions(&self, now_ms: u64, limit: usize) -> Result<usize, StoreError> {
        self.failed.guard(|| {
            let mut keys = Vec::new();
            for item in self
                .held_by_expiry
                .range(..expiry_key(now_ms.saturating_add(1), "", ""))
            {
                let (k, v) = item.map_err(db_err)?;
                if let Some((at, up, id)) = read_expiry_key(&k) {
                    keys.push((up.to_string(), id.to_string(), at, k.clone(), v));
                }
                if keys.len() >= limit {
                    break;
                }
            }
            let mut removed = 0;
            for (up, id, at, k, v) in keys {
                // Only a session still expired (a touch may have moved it since the scan).
                let expired = std::cell::Cell::new(false);
                let changed = self.change_held(&up, &id, |s| {
                    expired.set(s.expires_at <= now_ms);
                    (s.expires_at > now_ms).then_some(s)
                });
                match changed {
                    // Counted when this call removed it (the change's last run said expired, and its
                    // swap won).
                    Ok(stored) => removed += usize::from(stored && expired.get()),
                    // A value that cannot be read back (never written so) would stop every later
                    // sweep here: it goes, if still those bytes (a put may have replaced it since
                    // with a session that reads).
                    Err(StoreError::Corrupt(_)) => {
                        let key = task_key(&up, &id);
                        if let Some(bytes) = self.held.get(&key).map_err(db_err)? {
                            if HeldSessionRecord::decode(&bytes).is_err()
                                && remove_entry(&self.held, &key, &bytes)?
                            {
                                removed += 1;
                            }
                        }
                    }
                    Err(e) => return Err(e),
                }
                // The entry itself went with its session if it was the session's own. Otherwise it is
                // a leftover (no session, or one whose expiry moved on: a crash or a lost race, see
                // the module doc): it goes once surely not a write in progress, and only if still as
                // read (a write of the session may be asserting it again).
                if is_leftover(at, &v, now_ms) {
                    remove_entry(&self.held_by_expiry, &k, &v)?;
                }
            }
            Ok(removed)
        })
    }
}
