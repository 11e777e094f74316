//! Rewrites of one field inside a JSON message that leave every other byte as it arrived.
//!
//! A gateway that re-serialises a whole message after changing one field changes what it does not
//! own: `serde_json` (built here without `preserve_order` or `arbitrary_precision`) sorts object
//! keys and turns integers beyond 64 bits into floats. taskgate instead finds the field's value
//! with a borrowing parse (`&RawValue` points into the original bytes), and splices the new text
//! into the original bytes: key order, whitespace and the precision of every other number stay
//! exactly as the client or upstream sent them.
//!
//! Paths are object keys from the root (`["params", "task", "ttl"]`). Keys are compared after
//! JSON unescaping, so `"t\u0061sk"` is `task`. With duplicate keys the last one counts, as for
//! `serde_json::Value`, and [`replace`] changes that last one. [`remove`] splices out a member
//! whose key is written once and without escapes (a removal needs the key's position); a key
//! written with escapes, or repeated (where an earlier copy would surface once the last is gone),
//! is removed by a full rewrite of the message instead: correct, but not byte-exact, for those
//! malformed-looking messages only (found by `props::status_rewrite`).

use bytes::Bytes;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::fmt;
use std::ops::Range;

/// The value at `path` in `json`, borrowed from `json`.
///
/// `Ok(None)` when a key is missing or a value on the way is not an object. Errors: `json` is not
/// valid JSON (or nests deeper than serde_json's 128 levels).
///
/// One pass over `json` (issue 15: the walk that read the whole message as a `RawValue` and then
/// each object on the path again cost about 5,000 instructions per `params.taskId` of a
/// `tasks/get`). As before, the whole text must be UTF-8 and valid JSON, and of repeated keys the
/// last one counts.
pub fn raw_at<'a>(
    json: &'a [u8],
    path: &[&str],
) -> Result<Option<&'a RawValue>, serde_json::Error> {
    // Checked once here, as the whole-document `RawValue` did: the pass below reads a `str` and
    // skips the members off the path without checking their strings again.
    let Ok(text) = std::str::from_utf8(json) else {
        return serde_json::from_slice::<&RawValue>(json).map(|_| None);
    };
    let mut de = serde_json::Deserializer::from_str(text);
    let found = FindPath(path).deserialize(&mut de)?;
    de.end()?;
    Ok(found)
}

/// The value at a path (relative to the value deserialised), in one pass: members off the path
/// are skipped; `None` when a key is missing or a value on the way is not an object.
struct FindPath<'p>(&'p [&'p str]);

impl<'de> DeserializeSeed<'de> for FindPath<'_> {
    type Value = Option<&'de RawValue>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        if self.0.is_empty() {
            return <&'de RawValue as serde::Deserialize>::deserialize(d).map(Some);
        }
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for FindPath<'_> {
    type Value = Option<&'de RawValue>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let Some((first, rest)) = self.0.split_first() else {
            return Ok(None);
        };
        let mut found = None;
        while let Some(k) = map.next_key_seed(Key)? {
            if k == *first {
                // A repeated key: the last one counts.
                found = map.next_value_seed(FindPath(rest))?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }

    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

/// The byte range `inner` occupies in `outer`; `None` when `inner` does not borrow from `outer`.
pub fn span_of(outer: &[u8], inner: &RawValue) -> Option<Range<usize>> {
    let base = outer.as_ptr() as usize;
    let start = (inner.get().as_ptr() as usize).checked_sub(base)?;
    let end = start.checked_add(inner.get().len())?;
    (end <= outer.len()).then_some(start..end)
}

/// `json` with the value at `path` replaced by `replacement` (JSON text, inserted as it is).
///
/// `Ok(None)` when there is no value at `path`. Errors: `json` is not valid JSON.
pub fn replace(
    json: &[u8],
    path: &[&str],
    replacement: &str,
) -> Result<Option<Bytes>, serde_json::Error> {
    let Some(value) = raw_at(json, path)? else {
        return Ok(None);
    };
    let Some(span) = span_of(json, value) else {
        return Ok(None);
    };
    Ok(Some(splice(json, span, replacement.as_bytes())))
}

/// `json` without the member at `path` (its key, value and one separating comma; every copy
/// when the key is repeated).
///
/// `Ok(None)` when there is no such member. Errors: `json` is not valid JSON.
pub fn remove(json: &[u8], path: &[&str]) -> Result<Option<Bytes>, serde_json::Error> {
    let Some((last, parents)) = path.split_last() else {
        return Ok(None);
    };
    let Some(object) = raw_at(json, parents)? else {
        return Ok(None);
    };
    let Some(m) = member(object, last)? else {
        return Ok(None);
    };
    let spans = match (m.key_span, m.copies) {
        (Some(key), 1) => span_of_str(json, key).zip(span_of(json, m.value)),
        _ => None,
    };
    let Some((key, value)) = spans else {
        return remove_rewriting(json, parents, last);
    };
    // The key's opening quote is the byte before its text.
    let start = key.start - 1;
    let before = json[..start].iter().rposition(|b| !b.is_ascii_whitespace());
    let after = json[value.end..]
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .map(|i| value.end + i);
    let range = match (before.map(|i| json[i]), after.map(|i| json[i])) {
        // `…, "k": v` → drop from the comma before.
        (Some(b','), _) => before.unwrap_or(start)..value.end,
        // `{ "k": v, …` → drop through the comma after.
        (_, Some(b',')) => start..after.map_or(value.end, |i| i + 1),
        // The only member.
        _ => start..value.end,
    };
    Ok(Some(splice(json, range, b"")))
}

/// [`remove`] by a full rewrite: parse, drop the member, serialise.
fn remove_rewriting(
    json: &[u8],
    parents: &[&str],
    last: &str,
) -> Result<Option<Bytes>, serde_json::Error> {
    let mut value: serde_json::Value = serde_json::from_slice(json)?;
    let mut slot = &mut value;
    for key in parents {
        match slot.get_mut(*key) {
            Some(inner) => slot = inner,
            None => return Ok(None),
        }
    }
    let removed = slot.as_object_mut().and_then(|o| o.remove(last));
    if removed.is_none() {
        return Ok(None);
    }
    serde_json::to_vec(&value).map(|v| Some(Bytes::from(v)))
}

/// `json` with `member` (`"key":value`, JSON text inserted as it is) added as the first member
/// of `object`, an object that is a slice of `json` (a value a lookup borrowed from it); every
/// other byte stays as it was. `None` when `object` is not a slice of `json` or not an object.
/// The caller makes sure the key is not there already.
pub fn insert_first(json: &[u8], object: &str, member: &str) -> Option<Bytes> {
    let range = span_of_str(json, object)?;
    let inner = object.strip_prefix('{')?.strip_suffix('}')?;
    let at = range.start + 1;
    if inner.trim_matches([' ', '\t', '\n', '\r']).is_empty() {
        return Some(splice(json, at..at, member.as_bytes()));
    }
    let mut with = String::with_capacity(member.len() + 1);
    with.push_str(member);
    with.push(',');
    Some(splice(json, at..at, with.as_bytes()))
}

/// `bytes` with `range` replaced by `with`.
pub fn splice(bytes: &[u8], range: Range<usize>, with: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(bytes.len() - range.len() + with.len());
    out.extend_from_slice(&bytes[..range.start]);
    out.extend_from_slice(with);
    out.extend_from_slice(&bytes[range.end..]);
    Bytes::from(out)
}

/// The byte range `inner` (a slice of `outer`, not its first byte) occupies in `outer`; `None`
/// when it is not such a slice.
pub fn span_of_str(outer: &[u8], inner: &str) -> Option<Range<usize>> {
    let start = (inner.as_ptr() as usize).checked_sub(outer.as_ptr() as usize)?;
    let end = start.checked_add(inner.len())?;
    (end <= outer.len() && start >= 1).then_some(start..end)
}

/// One member of an object: its value, and its key's text when the key is written without escapes
/// (borrowed from the input, so its position is known).
struct Member<'a> {
    key_span: Option<&'a str>,
    value: &'a RawValue,
    /// How many times the key occurs in the object.
    copies: usize,
}

/// The member `key` of `object` (the last one, when repeated); `None` if absent or not an object.
fn member<'a>(object: &'a RawValue, key: &str) -> Result<Option<Member<'a>>, serde_json::Error> {
    if !object.get().starts_with('{') {
        return Ok(None);
    }
    let mut de = serde_json::Deserializer::from_str(object.get());
    FindMember(key).deserialize(&mut de)
}

struct FindMember<'k>(&'k str);

impl<'de> DeserializeSeed<'de> for FindMember<'_> {
    type Value = Option<Member<'de>>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for FindMember<'_> {
    type Value = Option<Member<'de>>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found: Option<Member<'de>> = None;
        while let Some(k) = map.next_key_seed(Key)? {
            if k == self.0 {
                let value: &'de RawValue = map.next_value()?;
                let key_span = match k {
                    Cow::Borrowed(s) => Some(s),
                    Cow::Owned(_) => None,
                };
                let copies = found.as_ref().map_or(1, |f| f.copies + 1);
                found = Some(Member {
                    key_span,
                    value,
                    copies,
                });
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }
}

/// A member key, borrowed from the input when it has no escapes (`Cow<str>`'s own `Deserialize`
/// always copies).
struct Key;

impl<'de> DeserializeSeed<'de> for Key {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(v))
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(b: Bytes) -> String {
        String::from_utf8(b.to_vec()).unwrap()
    }

    #[test]
    fn replace_keeps_key_order_whitespace_and_big_numbers() {
        let msg = br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"t","arguments":{"z":1,"a":123456789012345678901234567890,"f":1.10},"task":{ "ttl" : 99999999999 }}}"#;
        let out = replace(msg, &["params", "task", "ttl"], "60000")
            .unwrap()
            .unwrap();
        assert_eq!(
            s(out),
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"t","arguments":{"z":1,"a":123456789012345678901234567890,"f":1.10},"task":{ "ttl" : 60000 }}}"#
        );
    }

    #[test]
    fn escaped_keys_are_found_and_the_last_duplicate_counts() {
        let msg = br#"{"params":{"t\u0061sk":{"ttl":1,"ttl":2}}}"#;
        let out = replace(msg, &["params", "task", "ttl"], "3")
            .unwrap()
            .unwrap();
        assert_eq!(s(out), r#"{"params":{"t\u0061sk":{"ttl":1,"ttl":3}}}"#);
    }

    #[test]
    fn missing_paths_and_non_objects_are_none_and_invalid_json_is_an_error() {
        assert!(replace(br#"{"a":[1]}"#, &["a", "b"], "1")
            .unwrap()
            .is_none());
        assert!(replace(br#"{"a":1}"#, &["b"], "1").unwrap().is_none());
        assert!(replace(br#"[1,2]"#, &["a"], "1").unwrap().is_none());
        assert!(replace(br#"{"a":"#, &["a"], "1").is_err());
    }

    /// The one-pass walk answers as reading the whole document did: the whole text must be
    /// valid JSON and UTF-8 (off the path too), the last of repeated keys counts, and a value
    /// on the way that is not an object (scalars, arrays, null) ends the walk with `None`.
    #[test]
    fn raw_at_checks_the_whole_text_and_takes_the_last_duplicate() {
        let at =
            |json: &[u8], path: &[&str]| raw_at(json, path).map(|v| v.map(|r| r.get().to_string()));
        let msg = br#" {"a":{"b":1},"x":[{"b":2}],"a":{"b":3,"c":{"d":[4]}}} "#;
        assert_eq!(at(msg, &["a", "b"]).unwrap().as_deref(), Some("3"));
        assert_eq!(at(msg, &["a", "c", "d"]).unwrap().as_deref(), Some("[4]"));
        assert_eq!(
            at(msg, &[]).unwrap().as_deref(),
            Some(&std::str::from_utf8(msg).unwrap()[1..msg.len() - 1])
        );
        for missing in [&["a", "z"][..], &["x", "b"], &["a", "b", "c"], &["q"]] {
            assert_eq!(at(msg, missing).unwrap(), None, "{missing:?}");
        }
        for scalar in [&b"null"[..], b"true", b"-1", b"2.5", br#""s""#, b"[]"] {
            let doc = [&b"{\"a\":"[..], scalar, b"}"].concat();
            assert_eq!(at(&doc, &["a", "b"]).unwrap(), None);
        }
        // Invalid UTF-8 or JSON away from the path is still an error.
        assert!(raw_at(b"{\"a\":1,\"z\":\"\xff\"}", &["a"]).is_err());
        assert!(raw_at(br#"{"a":1,"z":[}"#, &["a"]).is_err());
        assert!(raw_at(br#"{"a":1} x"#, &["a"]).is_err());
    }

    #[test]
    fn remove_takes_one_comma_wherever_the_member_sits() {
        let cases: &[(&str, &str)] = &[
            (r#"{"a":1,"list":{},"b":2}"#, r#"{"a":1,"b":2}"#),
            (r#"{"list":{} , "b":2}"#, r#"{ "b":2}"#),
            (r#"{"a":1 ,"list":{"x":[1]}}"#, r#"{"a":1 }"#),
            (r#"{ "list" : true }"#, r#"{  }"#),
        ];
        for (input, want) in cases {
            let out = remove(input.as_bytes(), &["list"]).unwrap().unwrap();
            assert_eq!(s(out), *want, "{input}");
            serde_json::from_str::<serde_json::Value>(want).unwrap();
        }
        // An escaped or a repeated key: removed by a full rewrite (every copy goes).
        let escaped = remove(br#"{"l\u0069st":1,"b":2}"#, &["list"])
            .unwrap()
            .unwrap();
        assert_eq!(s(escaped), r#"{"b":2}"#);
        let repeated = remove(br#"{"list":1,"b":2,"list":3}"#, &["list"])
            .unwrap()
            .unwrap();
        assert_eq!(s(repeated), r#"{"b":2}"#);
        assert!(remove(br#"{"a":1}"#, &["list"]).unwrap().is_none());
    }
}
