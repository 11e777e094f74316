//! Sessions in the store: the 2025-11-25 sessions taskgate holds itself for an upstream
//! without 2025 sessions (see `layers::held_sessions`), and (issue 35) the sessions an upstream
//! issued that taskgate passes through ([`HeldSessionRecord::upstream_issued`]), kept so that an
//! `Mcp-Session-Id` stays valid for its owner across a restart and on every replica sharing a
//! PostgreSQL store (a tier needs no sticky routing). The names keep "held" from the first kind
//! (the sled trees and the PostgreSQL table are named so); both kinds share one record.
//!
//! One [`HeldSessionRecord`] per `(upstream, Mcp-Session-Id)`: written (durably) before the
//! session id leaves taskgate, its `expires_at` moved forward while the session is used
//! (`layers::session`), removed when the session ends (DELETE), is reclaimed as idle, or expires
//! (the registry's sweep, [`HeldSessionStore::remove_expired_held_sessions`]). Every field is
//! bounded ([`HeldSessionRecord::check`]): a record past a bound is neither written nor read
//! back.

use super::StoreError;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Longest `capabilities` object (JSON text, bytes) a held session keeps, in memory and stored,
/// as the client sent it; a longer one is kept as the capability names taskgate acts on
/// (`elicitation`, `sampling`, `roots`, each `{}`).
pub const MAX_HELD_CAPABILITIES: usize = 4096;
/// Longest `clientInfo` (JSON text, bytes) a held session keeps, in memory and stored; a longer
/// one is not kept.
pub const MAX_HELD_CLIENT_INFO: usize = 1024;
/// Longest stored `Mcp-Session-Id`, bytes. taskgate mints 32 hex digits; an upstream's, passed
/// through, is often a UUID, but 2025-11-25 basic/transports allows visible ASCII of any length
/// (a signed token, say), so the bound is generous: 2 KiB, kept below what one PostgreSQL B-tree
/// entry of the table's primary key `(upstream, session_id)` may hold (2704 bytes, a third of a
/// page; the upstream name adds at most [`MAX_HELD_UPSTREAM`]), so every id within it is stored on
/// either backend. An upstream session id past it is not stored: with a store other processes
/// share (a tier), its `initialize` is refused (HTTP 502, `-32603` naming the length and the
/// bound: no replica but one could serve it); with an embedded store it is served by this
/// process only, and not after a restart (`layers::session::issued`).
pub const MAX_HELD_SESSION_ID: usize = 2048;
/// Longest stored owner (a bearer principal's name, or an OAuth `<iss>#<sub>`).
pub const MAX_HELD_OWNER: usize = 1024;
/// Longest stored negotiated `protocolVersion`.
pub const MAX_HELD_PROTOCOL_VERSION: usize = 64;
/// Longest upstream name stored with a held session.
pub const MAX_HELD_UPSTREAM: usize = 256;

/// One session as the store keeps it (JSON in both backends): a held one, or one the upstream
/// issued ([`HeldSessionRecord::upstream_issued`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeldSessionRecord {
    /// The upstream's configured name.
    pub upstream: String,
    /// The `Mcp-Session-Id`: the one taskgate minted (a held session), or the upstream's own,
    /// which taskgate passes through (`upstream_issued`).
    pub session_id: String,
    /// The principal that initialized the session (its owner); `None` without authentication
    /// (whoever holds the session id is its owner).
    pub owner: Option<String>,
    /// The `protocolVersion` the session negotiated (`MCP-Protocol-Version` of its requests).
    pub protocol_version: Option<String>,
    /// The client's top-level capabilities taskgate acts on, as bits: 1 `tasks`,
    /// 2 `elicitation`, 4 `sampling`, 8 `roots`.
    pub capability_bits: u8,
    /// The `InitializeResult` taskgate answered declared `tasks.requests.tools.call`.
    pub upstream_tasks_tools_call: bool,
    /// The `InitializeResult` taskgate answered had capabilities without `tasks`.
    pub upstream_without_tasks: bool,
    /// The client's `initialize` `params.capabilities` as the held session keeps them (an
    /// object, at most [`MAX_HELD_CAPABILITIES`] bytes of JSON).
    pub client_capabilities: Value,
    /// The client's `params.clientInfo` (at most [`MAX_HELD_CLIENT_INFO`] bytes of JSON).
    pub client_info: Option<Value>,
    /// Unix time (ms) after which the session is idle past `gateway.session_idle_ms`: it is
    /// then never revived, and the sweep removes it.
    pub expires_at: u64,
    /// The session id is the upstream's (2025-11-25 basic/transports: Session Management),
    /// passed through by taskgate: requests of the session go upstream on it, and no
    /// `HeldSession` is made of the record. False (the default, as records written before
    /// issue 35 read): a session taskgate holds itself.
    #[serde(default)]
    pub upstream_issued: bool,
}

impl HeldSessionRecord {
    /// Checks every bound (see the constants); `Err` names the field past its bound.
    pub fn check(&self) -> Result<(), String> {
        let too_long = |what: &str, len: usize, max: usize| {
            (len > max).then(|| format!("held session {what} is {len} bytes, more than {max}"))
        };
        let json_len = |v: &Value| v.to_string().len();
        let problem = too_long("upstream", self.upstream.len(), MAX_HELD_UPSTREAM)
            .or_else(|| too_long("id", self.session_id.len(), MAX_HELD_SESSION_ID))
            .or_else(|| {
                too_long(
                    "owner",
                    self.owner.as_ref().map_or(0, String::len),
                    MAX_HELD_OWNER,
                )
            })
            .or_else(|| {
                too_long(
                    "protocolVersion",
                    self.protocol_version.as_ref().map_or(0, String::len),
                    MAX_HELD_PROTOCOL_VERSION,
                )
            })
            .or_else(|| {
                too_long(
                    "capabilities",
                    json_len(&self.client_capabilities),
                    MAX_HELD_CAPABILITIES,
                )
            })
            .or_else(|| {
                too_long(
                    "clientInfo",
                    self.client_info.as_ref().map_or(0, json_len),
                    MAX_HELD_CLIENT_INFO,
                )
            })
            .or_else(|| {
                (self.session_id.is_empty() || !self.client_capabilities.is_object())
                    .then(|| "held session without an id or a capabilities object".to_string())
            });
        match problem {
            Some(p) => Err(p),
            None => Ok(()),
        }
    }

    /// The stored form (JSON text).
    pub fn encode(&self) -> String {
        serde_json::to_string(self).expect("a held session always serialises")
    }

    /// Reads [`HeldSessionRecord::encode`]'s form, bounds checked.
    pub fn decode(bytes: &[u8]) -> Result<HeldSessionRecord, super::StoreError> {
        let r: HeldSessionRecord = serde_json::from_slice(bytes)
            .map_err(|e| super::StoreError::Corrupt(format!("held session: {e}")))?;
        r.check().map_err(super::StoreError::Corrupt)?;
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn bounds_are_checked_both_ways() {
        let ok = HeldSessionRecord {
            upstream: "u".into(),
            session_id: "0123".into(),
            owner: None,
            protocol_version: Some("2025-11-25".into()),
            capability_bits: 2,
            upstream_tasks_tools_call: true,
            upstream_without_tasks: false,
            client_capabilities: json!({"elicitation": {}}),
            client_info: Some(json!({"name": "c"})),
            expires_at: 1,
            upstream_issued: false,
        };
        assert_eq!(
            HeldSessionRecord::decode(ok.encode().as_bytes()).unwrap(),
            ok
        );
        let mut big = ok.clone();
        big.client_info = Some(json!({"name": "x".repeat(MAX_HELD_CLIENT_INFO)}));
        assert!(big.check().unwrap_err().contains("clientInfo"));
        assert!(HeldSessionRecord::decode(big.encode().as_bytes()).is_err());
        let mut no_id = ok.clone();
        no_id.session_id.clear();
        assert!(no_id.check().is_err());
        // A record written before `upstream_issued` existed reads as a held session.
        let mut old: Value = serde_json::from_str(&ok.encode()).unwrap();
        old.as_object_mut().unwrap().remove("upstream_issued");
        let old = HeldSessionRecord::decode(old.to_string().as_bytes()).unwrap();
        assert!(!old.upstream_issued);
        let passed = HeldSessionRecord {
            upstream_issued: true,
            ..ok
        };
        assert_eq!(
            HeldSessionRecord::decode(passed.encode().as_bytes()).unwrap(),
            passed
        );
    }
}

/// Where held sessions are kept: a part of every [`super::TaskStore`] (a supertrait, so each
/// backend implements it in its own `held.rs`).
pub trait HeldSessionStore {
    /// Writes a held session, replacing the one stored under its `(upstream, session_id)`;
    /// durable once [`super::TaskStore::sync`] has returned after it. Blocking (a store call:
    /// run it off the runtime).
    ///
    /// Why not durable on return: a caller that waited for the group commit on its blocking
    /// thread held that thread through the `fdatasync`, so a burst of `initialize`s (each
    /// writes its session) started a thread each (62 for 64 clients opening sessions at once,
    /// `benches/profile.sh`, issue 30); the caller now awaits `sync()` on the runtime.
    ///
    /// Errors: [`StoreError::Db`] naming the field when a bound of [`HeldSessionRecord::check`]
    /// is exceeded (nothing is written), or the store's.
    fn put_held_session(&self, session: HeldSessionRecord) -> Result<(), StoreError>;

    /// The held session `(upstream, session_id)`, expired or not (the caller compares
    /// `expires_at`). [`StoreError::Corrupt`] for a stored value past a bound.
    fn held_session(
        &self,
        upstream: &str,
        session_id: &str,
    ) -> Result<Option<HeldSessionRecord>, StoreError>;

    /// Moves a stored held session's `expires_at` (Unix ms) forward to `expires_at`, never back
    /// (touches queued on the store threads may run out of order: the latest expiry stands, and
    /// the sled store's index relies on an expiry never returning to an earlier value); never
    /// creates one. Whether it was stored. Durable with the next group commit.
    fn touch_held_session(
        &self,
        upstream: &str,
        session_id: &str,
        expires_at: u64,
    ) -> Result<bool, StoreError>;

    /// Removes a held session; whether it was stored. Durable with the next group commit.
    fn remove_held_session(&self, upstream: &str, session_id: &str) -> Result<bool, StoreError>;

    /// Removes at most `limit` held sessions whose `expires_at` is at or before `now_ms`
    /// (Unix ms), oldest first; how many were removed.
    fn remove_expired_held_sessions(&self, now_ms: u64, limit: usize) -> Result<usize, StoreError>;
}
