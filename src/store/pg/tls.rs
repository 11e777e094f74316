//! TLS to the database: rustls (the ring provider taskgate already uses for OAuth) through
//! `tokio-postgres-rustls`.
//!
//! TLS is used when the URL says `sslmode=require`, and then always (a server without TLS is
//! refused; never a fall-back to plain text), with the server's certificate chain **and host
//! name** verified (what libpq calls `verify-full`) against `store.ca_file` when set (PEM, one or
//! more CA certificates: a private CA, a managed database's CA bundle) and/or the set
//! `store.ca_roots` names (`"system"`: the platform's trust store), or else the Mozilla roots
//! (`webpki-roots`; see `crate::tls`). There is no "encrypt but trust anyone". `sslmode=disable` and `prefer` (the
//! driver's default) connect in plain text, as taskgate always did before TLS: libpq's `prefer`
//! encrypts without verifying anything, and verifying there would have refused, on upgrade, every
//! server with a certificate outside the roots (found by review).

use crate::tls::Trust;
use tokio_postgres_rustls::MakeRustlsConnect;

/// Whether connections use TLS: `sslmode=require` (see the module docs).
pub(super) fn wanted(config: &tokio_postgres::Config) -> bool {
    config.get_ssl_mode() == tokio_postgres::config::SslMode::Require
}

/// The connector for connections to the database, trusting `trust` (`store.ca_file`,
/// `store.ca_roots`; without either the Mozilla roots: [`crate::tls::client_config`]).
///
/// Errors: a message naming the file when it cannot be read, holds no certificate, or holds one
/// rustls cannot use; `ca_roots = "system"` with no certificate in the system trust store.
pub(super) fn connector(trust: Trust<'_>) -> Result<MakeRustlsConnect, String> {
    crate::tls::client_config("store", trust, None, &[]).map(MakeRustlsConnect::new)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_file_without_certificates_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("ca.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let err = connector(Trust::file(&empty)).err().expect("refused");
        assert!(
            err.contains("store.ca_file")
                && err.contains("ca.pem")
                && err.contains("no PEM certificate"),
            "{err}"
        );
        let missing = dir.path().join("missing.pem");
        let err = connector(Trust::file(&missing)).err().expect("refused");
        assert!(err.contains("missing.pem"), "{err}");
        assert!(connector(Trust::default()).is_ok());
    }
}
