//! An upstream reached through an HTTP proxy (`upstream.proxy = "http://[user:password@]host:port"`):
//! each new pooled connection is a TCP connection to the proxy, a `CONNECT host:port HTTP/1.1`
//! naming the upstream, and, once the proxy answers 2xx, the upstream's own bytes (TLS for an
//! `https://` upstream, plain HTTP/1.1 for an `http://` one) over that tunnel. The pooled
//! connection is the tunnel: kept alive and reused as a direct one. All of it happens at connect
//! time; a request on a pooled connection costs nothing more than on a direct one.
//!
//! The proxy's answer head is read whole before anything else is sent, bounded by
//! [`MAX_ANSWER_HEAD`] bytes and by the connect timeout (the pool's deadline covers the proxy's
//! TCP connect, the tunnel and the TLS handshake). A non-2xx answer fails the connection naming
//! the proxy's status (407, or tinyproxy's 401: credentials needed or refused). A proxy that
//! closes mid-answer, answers with something that is not HTTP/1, sends a head longer than the
//! bound, or sends bytes past its 2xx answer (nothing may come before the client speaks) fails
//! it too, naming why.
//!
//! Credentials: the proxy URL's userinfo (percent-decoded) becomes `Proxy-Authorization: Basic`.
//! They are never part of an error or a log line: the proxy is named by its `host:port` only.
//!
//! Why `CONNECT` for an `http://` upstream too (and not absolute-form requests to the proxy):
//! one code path, and a pooled connection that is the upstream's own byte stream whatever the
//! scheme (the chunked reader, the gate and keep-alive reuse are unchanged). A proxy that allows
//! `CONNECT` only to port 443 (squid's default `SSL_ports`) refuses an `http://` upstream on
//! another port with 403, which the error names.

use crate::config::ProxyUrl;
use std::fmt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The longest proxy answer head read (status line and headers, with the blank line).
pub const MAX_ANSWER_HEAD: usize = 8 * 1024;

/// The proxy of one upstream's connections.
#[derive(Clone)]
pub struct Proxy {
    /// `host:port` of the proxy: what is connected to and what errors name.
    authority: String,
    /// The `CONNECT` request head, written whole on each new connection.
    request: Box<[u8]>,
    /// Whether `request` carries `Proxy-Authorization`.
    credentials: bool,
}

/// Not derived: the request head holds the credentials.
impl fmt::Debug for Proxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Proxy")
            .field("authority", &self.authority)
            .field("credentials", &self.credentials)
            .finish()
    }
}

impl Proxy {
    /// The proxy `url` (`upstream.proxy`, parsed by the config check) for tunnels to `target`
    /// (the upstream's `host:port`, IPv6 in brackets).
    pub fn new(url: &ProxyUrl, target: &str) -> Proxy {
        let mut request = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
        if let Some(authorization) = &url.authorization {
            request.push_str(&format!("Proxy-Authorization: {authorization}\r\n"));
        }
        request.push_str("\r\n");
        Proxy {
            authority: url.authority.clone(),
            request: request.into_bytes().into_boxed_slice(),
            credentials: url.authorization.is_some(),
        }
    }

    /// The proxy's `host:port` (what a connection is opened to; never the credentials).
    pub fn authority(&self) -> &str {
        &self.authority
    }

    /// Asks the proxy, on `tcp`, for the tunnel: writes `CONNECT`, reads the answer head.
    /// `Ok` once it answered 2xx (then `tcp` carries the upstream's bytes).
    ///
    /// Errors: why, in words (the caller names the proxy and bounds the time).
    pub(super) async fn open(&self, tcp: &mut TcpStream) -> Result<(), String> {
        tcp.write_all(&self.request)
            .await
            .map_err(|e| format!("writing CONNECT: {e}"))?;
        let mut head = Vec::with_capacity(256);
        let mut buf = [0u8; 1024];
        let end = loop {
            let n = tcp
                .read(&mut buf)
                .await
                .map_err(|e| format!("reading its answer to CONNECT: {e}"))?;
            if n == 0 {
                return Err(if head.is_empty() {
                    "closed the connection without answering CONNECT".into()
                } else {
                    format!(
                        "closed the connection in the middle of its answer to CONNECT (after {} bytes)",
                        head.len()
                    )
                });
            }
            let from = head.len().saturating_sub(3);
            head.extend_from_slice(&buf[..n]);
            if let Some(at) = find_blank_line(&head[from..]) {
                break from + at;
            }
            if head.len() >= MAX_ANSWER_HEAD {
                return Err(format!(
                    "its answer to CONNECT has no end of head within {MAX_ANSWER_HEAD} bytes"
                ));
            }
        };
        if end > MAX_ANSWER_HEAD {
            return Err(format!(
                "its answer to CONNECT has no end of head within {MAX_ANSWER_HEAD} bytes"
            ));
        }
        let (code, reason) = status(&head[..end])?;
        if (200..300).contains(&code) {
            if head.len() > end {
                return Err(format!(
                    "sent {} bytes after its {code} answer to CONNECT, before the upstream was spoken to",
                    head.len() - end
                ));
            }
            return Ok(());
        }
        // 407 is the standard answer; tinyproxy answers a CONNECT it wants credentials for 401.
        let hint = match code {
            401 | 407 if self.credentials => {
                ": the proxy did not accept the credentials in upstream.proxy"
            }
            401 | 407 => {
                ": the proxy needs authentication; give its credentials in upstream.proxy as http://user:password@host:port"
            }
            _ => "",
        };
        Err(format!("refused CONNECT with {code} {reason}{hint}"))
    }
}

/// The offset just past the first `\r\n\r\n` in `bytes`.
fn find_blank_line(bytes: &[u8]) -> Option<usize> {
    bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| i + 4)
}

/// The status code and reason phrase (printable ASCII only, at most 80 characters) of an answer
/// head. Errors: its first line is not `HTTP/1.x NNN[ reason]`.
fn status(head: &[u8]) -> Result<(u16, String), String> {
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let not_http = || {
        let shown: String = String::from_utf8_lossy(&line[..line.len().min(40)])
            .chars()
            .flat_map(char::escape_default)
            .collect();
        format!("answered CONNECT with something that is not an HTTP/1 status line: \"{shown}\"")
    };
    let rest = line.strip_prefix(b"HTTP/1.").ok_or_else(not_http)?;
    let (code, reason) = match rest {
        [v, b' ', a, b, c, tail @ ..] if v.is_ascii_digit() => {
            let digits = [*a, *b, *c];
            if !digits.iter().all(u8::is_ascii_digit) || !(tail.is_empty() || tail[0] == b' ') {
                return Err(not_http());
            }
            let code = digits
                .iter()
                .fold(0u16, |n, d| n * 10 + u16::from(d - b'0'));
            (code, tail.get(1..).unwrap_or_default())
        }
        _ => return Err(not_http()),
    };
    let reason: String = reason
        .iter()
        .take(80)
        .map(|&b| {
            if b.is_ascii_graphic() || b == b' ' {
                b as char
            } else {
                '?'
            }
        })
        .collect();
    Ok((code, reason))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connect_request_names_the_target_and_carries_the_credentials() {
        let url = ProxyUrl::parse("http://proxy.corp:3128").unwrap();
        let p = Proxy::new(&url, "mcp.example.com:443");
        assert_eq!(p.authority(), "proxy.corp:3128");
        assert_eq!(
            &p.request[..],
            b"CONNECT mcp.example.com:443 HTTP/1.1\r\nHost: mcp.example.com:443\r\n\r\n"
        );
        let url = ProxyUrl::parse("http://al%40ice:p%3Ass@10.0.0.1:8080/").unwrap();
        let p = Proxy::new(&url, "[::1]:8443");
        let token = url.authorization.clone().unwrap();
        let want = format!(
            "CONNECT [::1]:8443 HTTP/1.1\r\nHost: [::1]:8443\r\nProxy-Authorization: {token}\r\n\r\n"
        );
        assert_eq!(std::str::from_utf8(&p.request).unwrap(), want);
        // The credentials are in no Debug output.
        assert!(!format!("{p:?}").contains(&token), "{p:?}");
    }

    #[test]
    fn status_lines_are_read_or_refused_without_panicking() {
        assert_eq!(
            status(b"HTTP/1.1 200 Connection established\r\n\r\n").unwrap(),
            (200, "Connection established".into())
        );
        assert_eq!(
            status(b"HTTP/1.0 407\r\n\r\n").unwrap(),
            (407, String::new())
        );
        assert_eq!(
            status(b"HTTP/1.1 502 Bad\x01Gateway\r\n\r\n").unwrap(),
            (502, "Bad?Gateway".into())
        );
        for bad in [
            &b""[..],
            b"HTTP/1.1",
            b"HTTP/1.1 20",
            b"HTTP/1.1 2000 x",
            b"HTTP/2 200 OK",
            b"SSH-2.0-OpenSSH\r\n\r\n",
            b"HTTP/1.1 2x0 OK",
            b"\xff\xfe\r\n\r\n",
        ] {
            assert!(status(bad).is_err(), "{bad:?}");
        }
    }
}
