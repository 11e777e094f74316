//! `upstream.proxy`'s URL: `http://[user:password@]host:port`, read once (at the config check,
//! and again where the upstream's pool and `/readyz` are built) into the proxy's `host:port` and
//! the `Proxy-Authorization` value of its credentials. The tunnel itself is
//! `upstream::h1::proxy`'s. Errors never quote the URL: it may hold a password.

use base64::Engine;
use std::fmt;

/// A parsed `upstream.proxy`.
#[derive(Clone)]
pub struct ProxyUrl {
    /// `host:port` of the proxy (IPv6 in brackets): what is connected to and what errors name.
    pub authority: String,
    /// `Basic <base64(user:password)>` when the URL has a userinfo (percent-decoded first).
    pub authorization: Option<String>,
}

/// Not derived: the authorization holds the credentials.
impl fmt::Debug for ProxyUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProxyUrl")
            .field("authority", &self.authority)
            .field("credentials", &self.authorization.is_some())
            .finish()
    }
}

impl ProxyUrl {
    /// Parses `url`. Errors: what is wrong with it, never quoting it.
    pub fn parse(url: &str) -> Result<ProxyUrl, String> {
        let uri: http::Uri = url
            .parse()
            .map_err(|_| "is not a URL (http://[user:password@]host:port)".to_string())?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => {
                return Err(
                    "https:// (TLS to the proxy) is not supported: give the proxy's http:// address (the upstream's own TLS runs inside the tunnel)"
                        .into(),
                )
            }
            _ => return Err("must be an http://host:port URL".into()),
        }
        let Some(authority) = uri.authority() else {
            return Err("must be an http://host:port URL".into());
        };
        let (Some(host), Some(port)) = (uri.host(), authority.port_u16()) else {
            return Err("must name the proxy's host and port: http://host:port".into());
        };
        if host.is_empty() {
            return Err("must name the proxy's host: http://host:port".into());
        }
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
            return Err("must be http://host:port, without a path or query".into());
        }
        let authorization = match authority.as_str().rsplit_once('@') {
            Some((userinfo, _)) => {
                let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
                let mut pair = percent_decode(user)?;
                // Basic's `user:password` splits at the first colon (RFC 7617 §2).
                if pair.contains(&b':') {
                    return Err("has a user name with a colon (%3A), which Basic authentication cannot carry".into());
                }
                pair.push(b':');
                pair.extend_from_slice(&percent_decode(password)?);
                Some(format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode(pair)
                ))
            }
            None => None,
        };
        Ok(ProxyUrl {
            authority: format!("{host}:{port}"),
            authorization,
        })
    }
}

/// `%XX`-decodes a URL's user or password. Errors: a `%` not followed by two hex digits.
fn percent_decode(s: &str) -> Result<Vec<u8>, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or("has a user or password with a % not followed by two hex digits")?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_authority_and_decoded_credentials_are_read() {
        let p = ProxyUrl::parse("http://proxy.corp:3128").unwrap();
        assert_eq!(p.authority, "proxy.corp:3128");
        assert!(p.authorization.is_none());
        let p = ProxyUrl::parse("http://al%40ice:p%3Ass@[::1]:8080/").unwrap();
        assert_eq!(p.authority, "[::1]:8080");
        let token = base64::engine::general_purpose::STANDARD.encode("al@ice:p:ss");
        assert_eq!(p.authorization, Some(format!("Basic {token}")));
        assert!(!format!("{p:?}").contains(&token), "{p:?}");
    }

    #[test]
    fn a_proxy_url_that_cannot_be_used_is_refused_without_quoting_it() {
        for (url, why) in [
            (
                "https://u:secret@proxy:3128",
                "https:// (TLS to the proxy) is not supported",
            ),
            (
                "socks5://u:secret@proxy:1080",
                "must be an http://host:port URL",
            ),
            (
                "http://u:secret@proxy",
                "must name the proxy's host and port",
            ),
            ("http://u:secret@proxy:3128/x", "without a path or query"),
            (
                "http://u:secret%zz@proxy:3128",
                "% not followed by two hex digits",
            ),
            ("not a url at all", "is not a URL"),
            ("http://u%3Av:secret@proxy:3128", "a user name with a colon"),
        ] {
            let err = ProxyUrl::parse(url).unwrap_err();
            assert!(err.contains(why), "{url}: {err}");
            assert!(!err.contains("secret"), "{url}: {err}");
        }
    }
}
