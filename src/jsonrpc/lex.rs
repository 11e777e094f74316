//! A cursor over one JSON text for taskgate's hand-written one-pass readers (the envelope,
//! `jsonrpc::envelope`; the 2025 `tasks/get` answer, `layers::observe::poll::scan`): the
//! tokens both read the same way, RFC 8259's grammar, each answering `None` where the reader
//! hands the text back to serde_json (a syntax error, or what it is not sure of). What a reader
//! keeps (members, duplicate keys, nesting) stays the reader's own.

/// The text, its bytes and the place read next.
pub(crate) struct Lex<'a> {
    /// The text (UTF-8); [`Lex::b`] is its bytes.
    pub text: &'a str,
    pub b: &'a [u8],
    pub i: usize,
}

impl<'a> Lex<'a> {
    /// At the start of `text`.
    pub fn new(text: &'a str) -> Lex<'a> {
        Lex {
            text,
            b: text.as_bytes(),
            i: 0,
        }
    }

    pub fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    pub fn eat(&mut self, c: u8) -> Option<()> {
        (self.peek()? == c).then(|| self.i += 1)
    }

    /// JSON whitespace (RFC 8259: space, tab, line feed, carriage return).
    pub fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.i += 1;
        }
    }

    /// After a member's value: `true` at `,` (another member follows), `false` at `}`.
    pub fn next_member(&mut self) -> Option<bool> {
        let c = self.peek()?;
        self.i += 1;
        match c {
            b',' => Some(true),
            b'}' => Some(false),
            _ => None,
        }
    }

    /// A string without any escape or control character (a key; the opening quote next): its
    /// text. Cut from the text (UTF-8 already): both ends are next to a quote, so on character
    /// boundaries; a `from_utf8` of each key cost ~70 instructions a key.
    pub fn plain_string(&mut self) -> Option<&'a str> {
        self.eat(b'"')?;
        let start = self.i;
        // The plain run ends at the closing quote, or at what makes the string not plain.
        self.i += plain_len(self.b.get(start..)?);
        if self.peek()? != b'"' {
            return None;
        }
        let text: &'a str = self.text;
        let s = text.get(start..self.i)?;
        self.i += 1;
        Some(s)
    }

    /// An object member's name and its colon (whitespace around each skipped): the name's text,
    /// `None` for a name with an escape or a control character (as [`Lex::plain_string`]).
    pub fn member_name(&mut self) -> Option<&'a str> {
        self.ws();
        let name = self.plain_string()?;
        self.ws();
        self.eat(b':')?;
        self.ws();
        Some(name)
    }

    /// A string (the opening quote next): control characters refused as JSON does; escapes
    /// other than `\u` checked; `\u` handed back (it may be a lone surrogate, which serde_json
    /// refuses in the members it reads).
    pub fn string(&mut self) -> Option<()> {
        self.eat(b'"')?;
        loop {
            // Most bytes are plain: skipped eight at a time.
            self.i += plain_len(self.b.get(self.i..)?);
            match self.peek()? {
                b'"' => {
                    self.i += 1;
                    return Some(());
                }
                b'\\' => match self.b.get(self.i + 1).copied()? {
                    b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => self.i += 2,
                    _ => return None,
                },
                _ => return None,
            }
        }
    }

    /// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?` (RFC 8259 section 6).
    pub fn number(&mut self) -> Option<()> {
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        match self.peek()? {
            b'0' => self.i += 1,
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            self.some_digits()?;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.i += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.i += 1;
            }
            self.some_digits()?;
        }
        Some(())
    }

    pub fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.peek() {
            self.i += 1;
        }
    }

    pub fn some_digits(&mut self) -> Option<()> {
        let start = self.i;
        self.digits();
        (self.i > start).then_some(())
    }

    /// `word` (`true`, `false`, `null`) next.
    pub fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.i.checked_add(word.len())?;
        (self.b.get(self.i..end)? == word).then(|| self.i = end)
    }
}

/// How many bytes at the start of `b` a JSON string holds as they are: up to the first quote,
/// backslash or control character (below U+0020), the bytes serde_json escapes (and the bytes
/// that end a plain run when reading); the whole length when there is none. Eight bytes at a
/// time (the bit tricks flag a byte exactly when it is one of those; the lowest flag is the
/// first such byte, later ones may be borrows). A reader hands it the rest of its text, not
/// only the string: the closing quote stops it, and the bytes after the string let the short
/// strings of a message (keys, methods) be read whole words at a time too.
///
/// Why: a byte-by-byte scan cost 6 to 8 instructions a byte, in the record's encoding
/// (`store::record`), the envelope reader and the one-pass reader of `tasks/get` answers
/// (issue 36).
#[inline]
pub fn plain_len(b: &[u8]) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let mut rest = b;
    let mut at = 0;
    while let Some((word, tail)) = rest.split_first_chunk::<8>() {
        let w = u64::from_le_bytes(*word);
        // A byte's high bit is flagged where it is clear in `w` and set by the subtraction: a
        // byte below 0x20, or zero once xored with a quote or a backslash (which leave the
        // high bit as it is in `w`, so one `!w` serves the three tests).
        let flags = (w.wrapping_sub(ONES * 0x20)
            | (w ^ (ONES * u64::from(b'"'))).wrapping_sub(ONES)
            | (w ^ (ONES * u64::from(b'\\'))).wrapping_sub(ONES))
            & !w
            & HIGH;
        if flags != 0 {
            return at + (flags.trailing_zeros() / 8) as usize;
        }
        at += 8;
        rest = tail;
    }
    at + rest
        .iter()
        .position(|&c| c < 0x20 || c == b'"' || c == b'\\')
        .unwrap_or(rest.len())
}

/// The JSON the readers' agreement tests edit texts with ([`random_edits`]): structure, a
/// quote and escapes, whitespace, number parts, literals, a control character and a two-byte
/// character. Each test adds the member names (and odd numbers) its reader looks for.
#[cfg(test)]
pub(crate) const JSON_TOKENS: [&str; 21] = [
    "{", "}", "[", "]", ":", ",", "\"", "\\", "\\u", "\\n", " ", "\t", "0", "1", "-", ".", "e",
    "true", "null", "\u{1}", "é",
];

/// For the readers' agreement tests: each of `rounds` texts made from `seeds` by one to three
/// random edits (a token of `tokens` inserted or put in place of a character, or a character
/// removed; xorshift from `seed`, so a failure is replayed), handed to `each`.
#[cfg(test)]
pub(crate) fn random_edits(
    seeds: &[&str],
    tokens: &[&str],
    seed: u64,
    rounds: usize,
    mut each: impl FnMut(&str),
) {
    let mut state = seed;
    let mut next = |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    for round in 0..rounds {
        let mut text: Vec<char> = seeds[round % seeds.len()].chars().collect();
        for _ in 0..1 + next(3) {
            let at = next(text.len() + 1);
            let token: Vec<char> = tokens[next(tokens.len())].chars().collect();
            match next(3) {
                0 => {
                    text.splice(at..at, token);
                }
                1 if at < text.len() => {
                    text.splice(at..at + 1, token);
                }
                _ if at < text.len() => {
                    text.remove(at);
                }
                _ => {}
            }
        }
        let text: String = text.into_iter().collect();
        each(&text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`plain_len`] finds the first byte serde_json escapes, as a byte-by-byte scan does:
    /// every special byte at every place of texts of every length up to 40, over plain bytes of
    /// every kind (ASCII, UTF-8 continuation bytes, 0x7f, the bytes next to the special ones).
    #[test]
    fn the_plain_length_is_the_first_escaped_byte() {
        let by_byte = |b: &[u8]| {
            b.iter()
                .position(|&c| c < 0x20 || c == b'"' || c == b'\\')
                .unwrap_or(b.len())
        };
        let fillers = [
            b'a', 0x7f, 0x80, 0xff, 0x21, 0x23, 0x5b, 0x5d, 0x20, 0xa2, 0xdc,
        ];
        let specials = [0u8, 0x01, 0x1f, b'"', b'\\'];
        for len in 0..40 {
            for &fill in &fillers {
                let plain = vec![fill; len];
                assert_eq!(plain_len(&plain), len);
                for at in 0..len {
                    for &special in &specials {
                        let mut text = plain.clone();
                        text[at] = special;
                        assert_eq!(plain_len(&text), by_byte(&text), "{text:?}");
                        // A second special byte after the first changes nothing.
                        if at + 3 < len {
                            text[at + 3] = b'"';
                            assert_eq!(plain_len(&text), at, "{text:?}");
                        }
                    }
                }
            }
        }
    }

    /// [`Lex::string`] and [`Lex::plain_string`] (which read words past a string's end) end
    /// where the byte-by-byte cursor ended them, with the same answer: strings of every length
    /// up to 24 with a quote, a backslash (each escape), a control character or a UTF-8 byte at
    /// every place, followed by nothing, by a quote or by more text.
    #[test]
    fn strings_end_where_the_byte_by_byte_reading_ends_them() {
        fn by_byte_string(b: &[u8]) -> Option<usize> {
            let mut i = 1;
            loop {
                match *b.get(i)? {
                    b'"' => return Some(i + 1),
                    b'\\' => match *b.get(i + 1)? {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => i += 2,
                        _ => return None,
                    },
                    c if c < 0x20 => return None,
                    _ => i += 1,
                }
            }
        }
        fn by_byte_plain(b: &[u8]) -> Option<usize> {
            let mut i = 1;
            loop {
                match *b.get(i)? {
                    b'"' => return Some(i + 1),
                    b'\\' => return None,
                    c if c < 0x20 => return None,
                    _ => i += 1,
                }
            }
        }
        let specials: [&str; 10] = [
            "\"", "\\n", "\\\"", "\\u0041", "\\x", "\\", "\u{1}", "\u{1f}", "é", "\u{7f}",
        ];
        let tails = ["", "\"", ",\"k\":1}", "\"abcdefghijklmnop"];
        for len in 0..24 {
            for at in 0..=len {
                for special in specials {
                    for tail in tails {
                        let mut body = "a".repeat(len);
                        body.insert_str(at, special);
                        let text = format!("\"{body}{tail}");
                        let b = text.as_bytes();
                        let mut lex = Lex::new(&text);
                        let got = lex.string().map(|()| lex.i);
                        assert_eq!(got, by_byte_string(b), "string {text:?}");
                        let mut lex = Lex::new(&text);
                        let got = lex.plain_string().map(|s| (s.len(), lex.i));
                        let want = by_byte_plain(b).map(|end| (end - 2, end));
                        assert_eq!(got, want, "plain_string {text:?}");
                    }
                }
            }
        }
    }
}
