//! Texts cut to a bound at a character boundary: what taskgate keeps of a text a client or an
//! upstream sends and it passes on or records (a span's attributes, a gateway task's progress
//! message, a stdio child's stderr line, an id echoed in an error).

/// `text`'s longest prefix of at most `max` bytes that ends at a character boundary.
pub fn prefix(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.get(..end).unwrap_or_default()
}

/// [`prefix`] of UTF-8 bytes (not checked here): cut before a continuation byte, never in a
/// character.
pub fn prefix_bytes(text: &[u8], max: usize) -> &[u8] {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while end > 0 && text.get(end).is_some_and(|b| b & 0xC0 == 0x80) {
        end -= 1;
    }
    text.get(..end).unwrap_or_default()
}

/// [`prefix`] as a `String`, marked `…` when cut.
pub fn cut(text: &str, max: usize) -> String {
    let kept = prefix(text, max);
    if kept.len() == text.len() {
        return text.to_string();
    }
    format!("{kept}…")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_are_cut_at_a_character_boundary() {
        assert_eq!(cut("abc", 3), "abc");
        assert_eq!(cut("abcd", 3), "abc…");
        assert_eq!(cut("aé", 2), "a…");
        assert_eq!(prefix("aé", 2), "a");
        assert_eq!(prefix_bytes("aé".as_bytes(), 2), b"a");
        assert_eq!(prefix_bytes(b"abc", 2), b"ab");
    }
}
