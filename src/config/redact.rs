//! `Debug` for the config sections that hold secrets: `[[upstream]]` (`proxy`'s
//! `user:password@`, `headers` and `env` values: an `Authorization`, an API key; `command`'s
//! arguments), `[store]`
//! (a database URL's password) and `[[auth.token]]` (a token's hash). Their `Debug` is written
//! by hand with these helpers, so `{:?}` of a `Config` (a log line, a test's failure, a panic)
//! never prints one; names, hosts and every other key still show. `telemetry::Settings` (the
//! OTLP export's headers) uses them too. Each impl destructures its
//! struct, so a field added later cannot be forgotten: it fails to compile until it is shown.

use std::collections::BTreeMap;
use std::fmt;

/// Shown in place of a secret value.
pub(crate) struct Redacted;

impl fmt::Debug for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// A URL shown without its credentials: everything between `scheme://` and the last `@` is
/// `***` (`http://***@proxy:3128`; the last `@`, so a password holding an unencoded `@` or
/// `/` is hidden whole), and a key/value or query form holding `password=` is hidden whole.
pub(crate) struct Url<'a>(pub &'a str);

impl fmt::Debug for Url<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let url = self.0;
        if url.to_ascii_lowercase().contains("password=") {
            return Redacted.fmt(f);
        }
        let start = url.find("://").map_or(0, |i| i + 3);
        match url[start..].rfind('@') {
            Some(at) => format!("{}***{}", &url[..start], &url[start + at..]).fmt(f),
            None => url.fmt(f),
        }
    }
}

/// A map shown by its keys only (header or variable names), each value [`Redacted`].
pub(crate) struct Names<'a>(pub &'a BTreeMap<String, String>);

impl fmt::Debug for Names<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.0.keys().map(|k| (k, Redacted)))
            .finish()
    }
}

/// A `command` shown by its program only; its arguments, which may hold a key
/// (`["server", "--api-key", "…"]`), are counted, not shown.
pub(crate) struct Command<'a>(pub &'a [String]);

impl fmt::Debug for Command<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.split_first() {
            None => f.write_str("[]"),
            Some((program, [])) => f.debug_list().entry(program).finish(),
            Some((program, args)) => {
                write!(f, "[{program:?}, <{} arguments redacted>]", args.len())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_credentials() {
        let shown = |u: &str| format!("{:?}", Url(u));
        assert_eq!(shown("http://u:pw@proxy:3128"), "\"http://***@proxy:3128\"");
        assert_eq!(shown("http://u:p/w@d@h:1"), "\"http://***@h:1\"");
        assert_eq!(shown("u:pw@h:1"), "\"***@h:1\"");
        assert_eq!(shown("http://proxy:3128"), "\"http://proxy:3128\"");
        assert_eq!(shown("host=db Password=pw"), "<redacted>");
        let mut m = BTreeMap::new();
        m.insert("Authorization".to_string(), "Bearer t".to_string());
        assert_eq!(
            format!("{:?}", Names(&m)),
            "{\"Authorization\": <redacted>}"
        );
    }
}
