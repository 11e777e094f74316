//! The sled store's keys: length-prefixed strings and big-endian integers, so any `taskId` bytes
//! are safe and ranges sort by time (see the parent module for the trees).

use crate::store::{Owner, TaskRecord};

/// Appends `s` as a 4-byte big-endian length and its bytes.
pub(in crate::store) fn push_str(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(&(s.len() as u32).to_be_bytes());
    buf.extend_from_slice(s.as_bytes());
}

/// Reads a string [`push_str`] wrote off the front of `buf`; `None` when short or not UTF-8.
pub(in crate::store) fn read_str<'a>(buf: &mut &'a [u8]) -> Option<&'a str> {
    let len = u32::from_be_bytes(buf.get(..4)?.try_into().ok()?) as usize;
    let s = std::str::from_utf8(buf.get(4..4 + len)?).ok()?;
    *buf = &buf[4 + len..];
    Some(s)
}

/// Reads a big-endian `u64` off the front of `buf`; `None` when short.
pub(in crate::store) fn read_u64(buf: &mut &[u8]) -> Option<u64> {
    let v = u64::from_be_bytes(buf.get(..8)?.try_into().ok()?);
    *buf = &buf[8..];
    Some(v)
}

/// `tasks` key: `(upstream, taskId)`.
pub(in crate::store) fn task_key(upstream: &str, task_id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + upstream.len() + task_id.len());
    push_str(&mut k, upstream);
    push_str(&mut k, task_id);
    k
}

/// `by_owner` prefix of one owner's records on `upstream`.
pub(in crate::store) fn owner_prefix(upstream: &str, owner: &Owner) -> Vec<u8> {
    let owner = owner.to_string();
    let mut k = Vec::with_capacity(8 + upstream.len() + owner.len());
    push_str(&mut k, upstream);
    push_str(&mut k, &owner);
    k
}

/// `by_owner` key: `(upstream, owner, recorded_at, taskId)`.
pub(in crate::store) fn owner_key(r: &TaskRecord) -> Vec<u8> {
    let mut k = owner_prefix(&r.upstream, &r.owner);
    k.extend_from_slice(&r.recorded_at.to_be_bytes());
    push_str(&mut k, &r.task_id);
    k
}

/// `by_expiry` key: `(expires_at, upstream, taskId)`.
pub(in crate::store) fn expiry_key(r: &TaskRecord) -> Vec<u8> {
    let mut k = Vec::with_capacity(16 + r.upstream.len() + r.task_id.len());
    k.extend_from_slice(&r.expires_at.to_be_bytes());
    push_str(&mut k, &r.upstream);
    push_str(&mut k, &r.task_id);
    k
}
