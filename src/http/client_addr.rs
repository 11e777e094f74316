//! The client's address behind trusted reverse proxies (`gateway.trusted_proxies`): the key of
//! the failed-authentication bound ([`crate::limits`]), of an anonymous caller's GET-stream cap
//! ([`crate::exchange::Tenant`]) and the request's `client_addr`.
//!
//! When the TCP peer is not in `trusted_proxies` (always, when it is empty: the default), the
//! client's address is the peer's. When it is, the client's address is the right-most address
//! of the forwarding chain that is not itself a trusted proxy: the chain is `X-Forwarded-For`
//! (comma-separated addresses, all its lines in order) or RFC 7239 `Forwarded` (the `for=`
//! parameter of each element, §5.2 and §6). Each proxy appends the address it received the
//! request from, so the entries right of the first untrusted one were written by trusted
//! proxies, and whatever a client wrote itself (its left-most entries) is never chosen.
//!
//! Falls back to the peer when the chain cannot be read: a header that is not UTF-8, an
//! element that is not an IP address where the choice lands (`unknown`, an obfuscated
//! `_identifier`, garbage), an unbalanced quote, or both headers present naming different
//! clients (one of them then was not written by the proxy). A chain made only of trusted
//! proxies gives its left-most entry. IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`) count as
//! their IPv4 address.

use http::header::HeaderMap;
use ipnet::IpNet;
use std::net::{IpAddr, SocketAddr};

/// `gateway.trusted_proxies` as networks: the reverse proxies whose forwarding headers are read.
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies {
    nets: Vec<IpNet>,
}

impl TrustedProxies {
    /// From the networks of `gateway.trusted_proxies` (none: forwarding headers are never read).
    pub fn new(nets: Vec<IpNet>) -> TrustedProxies {
        TrustedProxies { nets }
    }

    fn trusts(&self, addr: IpAddr) -> bool {
        self.nets.iter().any(|net| net.contains(&addr))
    }

    /// The client's address of a request from the TCP peer `peer` with head `headers` (see
    /// the module docs).
    pub fn client_address(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let peer = peer.to_canonical();
        if !self.trusts(peer) {
            return peer;
        }
        let xff = self.read_chain(headers, "x-forwarded-for", x_forwarded_for);
        let fwd = self.read_chain(headers, "forwarded", forwarded);
        match (xff, fwd) {
            (Chain::Absent, Chain::Absent) => peer,
            (Chain::Client(a), Chain::Absent) | (Chain::Absent, Chain::Client(a)) => a,
            (Chain::Client(a), Chain::Client(b)) if a == b => a,
            _ => peer,
        }
    }

    /// The client named by the header `name`'s chain, `parse` reading its entries.
    fn read_chain(
        &self,
        headers: &HeaderMap,
        name: &str,
        parse: fn(&str) -> Option<Vec<&str>>,
    ) -> Chain {
        let mut lines = headers.get_all(name).iter().peekable();
        if lines.peek().is_none() {
            return Chain::Absent;
        }
        let mut entries = Vec::new();
        for line in lines {
            let Ok(text) = line.to_str() else {
                return Chain::Malformed;
            };
            match parse(text) {
                Some(mut e) => entries.append(&mut e),
                None => return Chain::Malformed,
            }
        }
        let mut left_most = None;
        for entry in entries.iter().rev() {
            let Some(addr) = node_address(entry) else {
                return Chain::Malformed;
            };
            if !self.trusts(addr) {
                return Chain::Client(addr);
            }
            left_most = Some(addr);
        }
        left_most.map_or(Chain::Malformed, Chain::Client)
    }
}

/// What one forwarding header says.
enum Chain {
    /// The request has no such header.
    Absent,
    /// It cannot be read (see the module docs).
    Malformed,
    /// It names this client.
    Client(IpAddr),
}

/// The entries of one `X-Forwarded-For` line, left to right.
fn x_forwarded_for(line: &str) -> Option<Vec<&str>> {
    Some(line.split(',').map(str::trim).collect())
}

/// The `for=` values of one `Forwarded` line (RFC 7239 §4), left to right; `None` when an
/// element has no `for=` or a quote is unbalanced.
fn forwarded(line: &str) -> Option<Vec<&str>> {
    let mut out = Vec::new();
    for element in split_unquoted(line, ',')? {
        let value = split_unquoted(element, ';')?.into_iter().find_map(|pair| {
            let (name, value) = pair.trim().split_once('=')?;
            name.trim()
                .eq_ignore_ascii_case("for")
                .then(|| value.trim())
        })?;
        // A quoted node (§6) holds no escapes in an address; one with them is no address.
        let value = match value.strip_prefix('"') {
            Some(rest) => rest.strip_suffix('"')?,
            None => value,
        };
        out.push(value);
    }
    Some(out)
}

/// `text` split at `sep` outside double-quoted strings (RFC 7230 §3.2.6, with `\` escapes);
/// `None` for an unbalanced quote.
fn split_unquoted(text: &str, sep: char) -> Option<Vec<&str>> {
    let mut parts = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            c if c == sep && !quoted => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if quoted {
        return None;
    }
    parts.push(&text[start..]);
    Some(parts)
}

/// The IP address of one chain entry: `a.b.c.d`, `a.b.c.d:port`, an IPv6 address, `[v6]` or
/// `[v6]:port`; `None` for anything else (`unknown`, `_hidden`, empty, garbage).
fn node_address(entry: &str) -> Option<IpAddr> {
    let entry = entry.trim();
    let addr = entry
        .parse::<IpAddr>()
        .ok()
        .or_else(|| entry.parse::<SocketAddr>().ok().map(|s| s.ip()))
        .or_else(|| {
            entry
                .strip_prefix('[')?
                .strip_suffix(']')?
                .parse::<std::net::Ipv6Addr>()
                .ok()
                .map(IpAddr::V6)
        })?;
    Some(addr.to_canonical())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proxies(nets: &[&str]) -> TrustedProxies {
        TrustedProxies::new(nets.iter().map(|n| n.parse().expect("net")).collect())
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.append(
                http::header::HeaderName::from_bytes(name.as_bytes()).expect("name"),
                value.parse().expect("value"),
            );
        }
        h
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    const NGINX: &str = "10.0.0.5";

    #[test]
    fn no_trusted_proxies_is_the_peer() {
        let h = headers(&[("x-forwarded-for", "203.0.113.7")]);
        assert_eq!(
            TrustedProxies::default().client_address(ip(NGINX), &h),
            ip(NGINX)
        );
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_it_sends() {
        let p = proxies(&["10.0.0.0/8"]);
        let h = headers(&[("x-forwarded-for", "203.0.113.7")]);
        assert_eq!(p.client_address(ip("198.51.100.1"), &h), ip("198.51.100.1"));
    }

    #[test]
    fn behind_a_trusted_proxy_the_right_most_entry_is_the_client() {
        let p = proxies(&["10.0.0.0/8"]);
        let h = headers(&[("x-forwarded-for", "203.0.113.7")]);
        assert_eq!(p.client_address(ip(NGINX), &h), ip("203.0.113.7"));
        // No header: the proxy itself.
        assert_eq!(p.client_address(ip(NGINX), &HeaderMap::new()), ip(NGINX));
    }

    #[test]
    fn spoofed_left_most_entries_are_ignored() {
        let p = proxies(&["10.0.0.0/8"]);
        // The client sent "1.2.3.4, 10.9.9.9" itself; nginx appended its real address.
        let h = headers(&[("x-forwarded-for", "1.2.3.4, 10.9.9.9, 203.0.113.7")]);
        assert_eq!(p.client_address(ip(NGINX), &h), ip("203.0.113.7"));
        // Spread over two lines, in order.
        let h = headers(&[
            ("x-forwarded-for", "1.2.3.4"),
            ("x-forwarded-for", "203.0.113.7"),
        ]);
        assert_eq!(p.client_address(ip(NGINX), &h), ip("203.0.113.7"));
        // Garbage left of the client's real address is never looked at.
        let h = headers(&[("x-forwarded-for", "not an ip, ,203.0.113.7")]);
        assert_eq!(p.client_address(ip(NGINX), &h), ip("203.0.113.7"));
    }

    #[test]
    fn a_chain_of_trusted_proxies_is_skipped() {
        let p = proxies(&["10.0.0.0/8", "192.168.1.1/32"]);
        // client -> 192.168.1.1 (CDN) -> 10.0.0.6 (lb) -> nginx 10.0.0.5 -> taskgate
        let h = headers(&[(
            "x-forwarded-for",
            "6.6.6.6, 203.0.113.7, 192.168.1.1, 10.0.0.6",
        )]);
        assert_eq!(p.client_address(ip(NGINX), &h), ip("203.0.113.7"));
        // Only trusted proxies: the left-most.
        let h = headers(&[("x-forwarded-for", "192.168.1.1, 10.0.0.6")]);
        assert_eq!(p.client_address(ip(NGINX), &h), ip("192.168.1.1"));
    }

    #[test]
    fn ipv6_clients_and_proxies() {
        let p = proxies(&["fd00::/8", "10.0.0.0/8"]);
        let h = headers(&[("x-forwarded-for", "2001:db8::1, fd00::2")]);
        assert_eq!(p.client_address(ip("fd00::1"), &h), ip("2001:db8::1"));
        let h = headers(&[("x-forwarded-for", "[2001:db8::7]:4711")]);
        assert_eq!(p.client_address(ip("fd00::1"), &h), ip("2001:db8::7"));
        // A dual-stack listener sees the IPv4 proxy as an IPv4-mapped address.
        let h = headers(&[("x-forwarded-for", "203.0.113.7:5555")]);
        assert_eq!(
            p.client_address(ip("::ffff:10.0.0.5"), &h),
            ip("203.0.113.7")
        );
    }

    #[test]
    fn rfc7239_forwarded() {
        let p = proxies(&["10.0.0.0/8"]);
        let h = headers(&[(
            "forwarded",
            r#"for=1.2.3.4;proto=https, for="[2001:db8:cafe::17]:4711";by=10.0.0.5, for=10.0.0.6"#,
        )]);
        assert_eq!(p.client_address(ip(NGINX), &h), ip("2001:db8:cafe::17"));
        let h = headers(&[("forwarded", "For=\"203.0.113.7\"")]);
        assert_eq!(p.client_address(ip(NGINX), &h), ip("203.0.113.7"));
        // A quoted comma in a client's element does not split it.
        let h = headers(&[("forwarded", r#"for="1.2.3.4,5.6.7.8", for=203.0.113.7"#)]);
        assert_eq!(p.client_address(ip(NGINX), &h), ip("203.0.113.7"));
        // Both headers naming the same client.
        let h = headers(&[
            ("forwarded", "for=203.0.113.7"),
            ("x-forwarded-for", "203.0.113.7"),
        ]);
        assert_eq!(p.client_address(ip(NGINX), &h), ip("203.0.113.7"));
    }

    #[test]
    fn malformed_headers_fall_back_to_the_peer() {
        let p = proxies(&["10.0.0.0/8"]);
        for h in [
            headers(&[("x-forwarded-for", "1.2.3.4, garbage")]),
            headers(&[("x-forwarded-for", "")]),
            headers(&[("x-forwarded-for", "203.0.113.7,")]),
            headers(&[("forwarded", "for=unknown")]),
            headers(&[("forwarded", "for=_hidden")]),
            headers(&[("forwarded", "proto=https")]),
            headers(&[("forwarded", "for=\"203.0.113.7")]),
            // Two headers naming different clients: one was not written by the proxy.
            headers(&[
                ("forwarded", "for=1.2.3.4"),
                ("x-forwarded-for", "203.0.113.7"),
            ]),
        ] {
            assert_eq!(p.client_address(ip(NGINX), &h), ip(NGINX), "{h:?}");
        }
        let mut h = HeaderMap::new();
        h.insert(
            "x-forwarded-for",
            http::HeaderValue::from_bytes(b"203.0.113.\xff").expect("value"),
        );
        assert_eq!(p.client_address(ip(NGINX), &h), ip(NGINX));
    }
}
