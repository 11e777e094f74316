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

/// `by_owner` prefix of one owner's records on `upstream`: the owner as its stored form
/// (`Owner`'s `Display`), written without the formatting machinery.
pub(in crate::store) fn owner_prefix(upstream: &str, owner: &Owner) -> Vec<u8> {
    owner_prefix_with(upstream, owner, 0)
}

/// [`owner_prefix`] in a buffer with room for `more` bytes after it.
///
/// Why: formatting the owner (`to_string`) and growing the key for its tail cost about 1,600
/// instructions per creation (callgrind, issue 36).
fn owner_prefix_with(upstream: &str, owner: &Owner, more: usize) -> Vec<u8> {
    let (tag, name) = match owner {
        Owner::Principal(p) => ("principal:", p.as_str()),
        Owner::Session(s) => ("session:", s.as_str()),
        Owner::Anonymous => ("anonymous", ""),
    };
    let owner_len = tag.len() + name.len();
    let mut k = Vec::with_capacity(8 + upstream.len() + owner_len + more);
    push_str(&mut k, upstream);
    k.extend_from_slice(&(owner_len as u32).to_be_bytes());
    k.extend_from_slice(tag.as_bytes());
    k.extend_from_slice(name.as_bytes());
    k
}

/// `by_owner` key: `(upstream, owner, recorded_at, taskId)`.
pub(in crate::store) fn owner_key(r: &TaskRecord) -> Vec<u8> {
    let mut k = owner_prefix_with(&r.upstream, &r.owner, 12 + r.task_id.len());
    k.extend_from_slice(&r.recorded_at.to_be_bytes());
    push_str(&mut k, &r.task_id);
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The prefix holds each owner in its stored form, as `Display` writes it (the keys of
    /// stores written before are found again).
    #[test]
    fn the_owner_prefix_holds_the_stored_form() {
        for owner in [
            Owner::Principal("alice:x".into()),
            Owner::Session("s-1".into()),
            Owner::Anonymous,
            Owner::Principal(String::new()),
        ] {
            let mut expected = Vec::new();
            push_str(&mut expected, "up");
            push_str(&mut expected, &owner.to_string());
            assert_eq!(owner_prefix("up", &owner), expected, "{owner}");
        }
    }
}

/// `by_expiry` key: `(expires_at, upstream, taskId)`.
pub(in crate::store) fn expiry_key(r: &TaskRecord) -> Vec<u8> {
    let mut k = Vec::with_capacity(16 + r.upstream.len() + r.task_id.len());
    k.extend_from_slice(&r.expires_at.to_be_bytes());
    push_str(&mut k, &r.upstream);
    push_str(&mut k, &r.task_id);
    k
}
