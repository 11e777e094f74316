//! A one-pass reader of a message's envelope, for the shape nearly every message has; anything
//! else is left to serde_json ([`read`] answers `None`).
//!
//! Why hand-written: for a small `tools/call` (~90 bytes) the nesting and UTF-8 check
//! (`check_json`) and serde_json's envelope parse cost about 4,400 instructions per request
//! together (serde_json's skip of `params` alone ~1,300, with an allocation for its nesting
//! stack; benches/profile.sh small). This reader checks the whole text's grammar, as the
//! parse did, in one pass.
//!
//! It is conservative: it accepts only text that serde_json accepts with the same envelope.
//! Whatever it is not sure of (a `\u` escape, which may be a lone surrogate; an escaped key; a
//! known member twice or `null`; a `method` that is not a plain string; nesting deeper than
//! [`super::MAX_DEPTH`]; any syntax error) it hands back, and the caller parses with serde_json
//! as before, which then decides and words the error.
//!
//! Duplicate keys (issue 29 item 13): a key that occurs twice in one object, at any depth, is
//! handed back too, and the caller refuses the message (`super::duplicate_key`): serde_json
//! keeps the last of two members while other parsers keep the first, so taskgate and the
//! upstream could act on different `params.taskId`s. The check is made during the same pass:
//! each key is compared with the keys met before it in its object (their places in the text,
//! kept in a fixed array: no allocation), which for the few keys of a common message costs a
//! few comparisons of short slices; a message holding more than [`KEYS`] keys on one path of
//! open objects is handed back (serde_json's parse then checks it). A key with an escape is
//! handed back as well (`"a\/b"` and `"a/b"` are the same key).

use super::lex::{plain_len, Lex};

/// The envelope members of a message, as the serde_json parse reports them: the raw JSON text
/// of `jsonrpc` and `id`, the text of a `method` string, whether `result` and `error` are there.
pub(super) struct Members<'a> {
    pub jsonrpc: Option<&'a str>,
    pub id: Option<&'a str>,
    pub method: Option<&'a str>,
    pub result: bool,
    pub error: bool,
    /// Where `params` and its members are (see [`super::Params`]).
    pub params: super::Params,
}

/// The envelope of `text` (already known to be UTF-8) when `text` is one JSON object of the
/// common shape; `None` to let serde_json decide.
pub(super) fn read(text: &str) -> Option<Members<'_>> {
    let mut r = Reader {
        lex: Lex::new(text),
        keys: [(0, 0); KEYS],
        open: 0,
    };
    let mut m = Members {
        jsonrpc: None,
        id: None,
        method: None,
        result: false,
        error: false,
        params: super::Params::ABSENT,
    };
    r.ws();
    r.eat(b'{')?;
    r.ws();
    if r.peek()? == b'}' {
        r.i += 1;
    } else {
        loop {
            r.ws();
            let key_at = r.i + 1;
            let key = r.plain_string()?;
            r.new_key(0, key_at, r.i - 1)?;
            r.ws();
            r.eat(b':')?;
            r.ws();
            let start = r.i;
            // A known member twice is serde's "duplicate field" error, `null` its `None`: both
            // left to it (a key twice is handed back by `new_key` above).
            match Top::of_key(key.as_bytes()) {
                // The one member read with an index of its own members: where each of
                // `params`' keys and values are, so nothing reads `params` again for them.
                Top::Params => m.params = r.params(start)?,
                // `method` as serde reads it into a string: only a plain one here (its text
                // without the quotes; an escape, `null` or another type is serde's).
                Top::Method => m.method = Some(r.plain_string()?),
                Top::Jsonrpc => m.jsonrpc = Some(r.non_null(start)?),
                Top::Id => m.id = Some(r.non_null(start)?),
                Top::Result => m.result = r.non_null(start).map(|_| true)?,
                Top::Error => m.error = r.non_null(start).map(|_| true)?,
                Top::Other => r.value(1)?,
            }
            r.ws();
            if !r.next_member()? {
                break;
            }
        }
    }
    r.ws();
    if r.i != r.b.len() {
        return None;
    }
    Some(m)
}

/// The envelope's members by their key.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Top {
    Jsonrpc,
    Id,
    Method,
    Params,
    Result,
    Error,
    Other,
}

impl Top {
    /// The member a key names. (Byte patterns: a length test and byte comparisons, where a
    /// `match` on string literals called `memcmp` for each key and arm.)
    #[inline(always)]
    fn of_key(key: &[u8]) -> Top {
        match key {
            [b'j', b's', b'o', b'n', b'r', b'p', b'c'] => Top::Jsonrpc,
            [b'i', b'd'] => Top::Id,
            [b'm', b'e', b't', b'h', b'o', b'd'] => Top::Method,
            [b'p', b'a', b'r', b'a', b'm', b's'] => Top::Params,
            [b'r', b'e', b's', b'u', b'l', b't'] => Top::Result,
            [b'e', b'r', b'r', b'o', b'r'] => Top::Error,
            _ => Top::Other,
        }
    }
}

/// Keys (of the objects open on the current path) whose places [`Reader`] keeps to find a
/// duplicate; a message with more is handed back.
const KEYS: usize = 64;

struct Reader<'a> {
    /// The text and the place read next (the tokens, [`Lex`]'s).
    lex: Lex<'a>,
    /// The keys of the objects open on the current path, outermost first, as (start, end) of
    /// their text without the quotes; the first [`Reader::open`] are in use.
    keys: [(u32, u32); KEYS],
    open: usize,
}

impl<'a> std::ops::Deref for Reader<'a> {
    type Target = Lex<'a>;
    fn deref(&self) -> &Lex<'a> {
        &self.lex
    }
}

impl<'a> std::ops::DerefMut for Reader<'a> {
    fn deref_mut(&mut self) -> &mut Lex<'a> {
        &mut self.lex
    }
}

impl<'a> Reader<'a> {
    /// The value starting at `start` (the place read next), read whole: its text, `None`
    /// (handed back) for `null` or a value the reader does not take.
    fn non_null(&mut self, start: usize) -> Option<&'a str> {
        self.value(1)?;
        let text: &'a str = self.text;
        text.get(start..self.i).filter(|v| *v != "null")
    }

    /// Notes the key at `start..end` (no escape in it) of the object whose first key is at
    /// `keys[base]`: `None` (handed back) when that object has it already, or when [`KEYS`]
    /// keys are open.
    fn new_key(&mut self, base: usize, start: usize, end: usize) -> Option<()> {
        let key = self.b.get(start..end)?;
        for &(s, e) in self.keys.get(base..self.open)? {
            if self.b.get(s as usize..e as usize) == Some(key) {
                return None;
            }
        }
        let slot = self.keys.get_mut(self.open)?;
        *slot = (u32::try_from(start).ok()?, u32::try_from(end).ok()?);
        self.open += 1;
        Some(())
    }

    /// A key (the opening quote next): its text's place, without the quotes. A key with an
    /// escape or a control character is handed back (`None`).
    fn key(&mut self) -> Option<(usize, usize)> {
        self.eat(b'"')?;
        let start = self.i;
        self.i += plain_len(self.b.get(start..)?);
        self.eat(b'"')?;
        Some((start, self.i - 1))
    }

    /// The envelope's `params` value (at `start`): read as any value, and when it is an object,
    /// with the place of each of its members noted ([`super::Params`]).
    fn params(&mut self, start: usize) -> Option<super::Params> {
        let mut params = super::Params::ABSENT;
        params.at = u32::try_from(start).ok()?;
        if self.peek()? == b'{' {
            params.state = super::ParamsState::Indexed;
            self.object(1, Some(&mut params))?;
        } else {
            params.state = super::ParamsState::NotAnObject;
            self.value(1)?;
        }
        params.end(self.i);
        Some(params)
    }

    /// An object (the `{` next) at nesting `depth`; with `index`, its members' places are
    /// noted there (past [`super::PARAMS`] members the index says so, and lookups walk).
    fn object(&mut self, depth: usize, mut index: Option<&mut super::Params>) -> Option<()> {
        if depth >= super::MAX_DEPTH {
            return None;
        }
        self.i += 1;
        self.ws();
        if self.peek()? == b'}' {
            self.i += 1;
            return Some(());
        }
        // This object's keys follow the open ones of its parents; they are let go
        // when it ends.
        let base = self.open;
        loop {
            self.ws();
            let (start, end) = self.key()?;
            self.new_key(base, start, end)?;
            self.ws();
            self.eat(b':')?;
            self.ws();
            let value_at = self.i;
            self.value(depth + 1)?;
            if let Some(index) = index.as_deref_mut() {
                index.note(start, value_at, self.i, self.b.get(start..end)?);
            }
            self.ws();
            if !self.next_member()? {
                self.open = base;
                return Some(());
            }
        }
    }

    /// One value at nesting `depth` (the envelope object is 1).
    fn value(&mut self, depth: usize) -> Option<()> {
        match self.peek()? {
            b'"' => self.string(),
            b'{' => self.object(depth, None),
            b'[' => {
                if depth >= super::MAX_DEPTH {
                    return None;
                }
                self.i += 1;
                self.ws();
                if self.peek()? == b']' {
                    self.i += 1;
                    return Some(());
                }
                loop {
                    self.ws();
                    self.value(depth + 1)?;
                    self.ws();
                    let c = self.peek()?;
                    self.i += 1;
                    match c {
                        b',' => continue,
                        b']' => return Some(()),
                        _ => return None,
                    }
                }
            }
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            _ => self.number(),
        }
    }
}
