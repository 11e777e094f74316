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
        loop {
            match self.peek()? {
                b'"' => break,
                b'\\' => return None,
                c if c < 0x20 => return None,
                _ => self.i += 1,
            }
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
            // Most bytes are plain: skipped in a tight loop.
            while let Some(&c) = self.b.get(self.i) {
                if c == b'"' || c == b'\\' || c < 0x20 {
                    break;
                }
                self.i += 1;
            }
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
