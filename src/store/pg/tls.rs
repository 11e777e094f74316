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
//!
//! With `store.client_cert_file` and `store.client_key_file` the connection presents that
//! certificate when the server asks for one (mTLS: a `pg_hba.conf` `cert` method or
//! `clientcert=verify-full`, a managed database that requires client certificates).

use crate::tls::ClientTls;
use tokio_postgres_rustls::MakeRustlsConnect;

/// Whether connections use TLS: `sslmode=require` (see the module docs).
pub(super) fn wanted(config: &tokio_postgres::Config) -> bool {
    config.get_ssl_mode() == tokio_postgres::config::SslMode::Require
}

/// Refuses a client certificate that would never be sent: `store.client_cert_file` with a URL
/// that does not say `sslmode=require` (the connection would be plain text, and the server's
/// refusal would not name the certificate).
pub(super) fn check_client_auth(
    config: &tokio_postgres::Config,
    tls: &ClientTls<'_>,
) -> Result<(), String> {
    if tls.client_auth.is_some() && !wanted(config) {
        return Err(
            "store.client_cert_file is set but the URL does not say sslmode=require: \
                    the certificate is only presented over TLS"
                .into(),
        );
    }
    Ok(())
}

/// The connector for connections to the database, trusting `tls.trust` (`store.ca_file`,
/// `store.ca_roots`; without either the Mozilla roots: [`crate::tls::client_config`]) and
/// presenting `tls.client_auth` when set.
///
/// Errors: a message naming the key and the file when one cannot be read, holds no certificate
/// (or no key), or holds one rustls cannot use; `ca_roots = "system"` with no certificate in the
/// system trust store.
pub(super) fn connector(tls: ClientTls<'_>) -> Result<MakeRustlsConnect, String> {
    crate::tls::client_config("store", tls.trust, tls.client_auth, &[]).map(MakeRustlsConnect::new)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::Trust;

    #[test]
    fn a_ca_file_without_certificates_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("ca.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let err = connector(Trust::file(&empty).into())
            .err()
            .expect("refused");
        assert!(
            err.contains("store.ca_file")
                && err.contains("ca.pem")
                && err.contains("no PEM certificate"),
            "{err}"
        );
        let missing = dir.path().join("missing.pem");
        let err = connector(Trust::file(&missing).into())
            .err()
            .expect("refused");
        assert!(err.contains("missing.pem"), "{err}");
        assert!(connector(Trust::default().into()).is_ok());
    }

    /// A TLS file that cannot be read is an error of `open`, not a panic: `serve` opens the
    /// store on a runtime, where the store's own runtime, built before the connector failed,
    /// was dropped (the last stop's binary panicked here with `store.ca_file` missing).
    #[tokio::test]
    async fn an_unreadable_tls_file_fails_the_open_without_a_panic() {
        let url = "postgres://tg@127.0.0.1:9/db?sslmode=require";
        let missing = std::path::Path::new("/nonexistent/ca.pem");
        let err = crate::store::PgStore::open(url, 1, Trust::file(missing))
            .await
            .err()
            .expect("refused");
        assert!(
            err.to_string()
                .contains("store.ca_file /nonexistent/ca.pem"),
            "{err}"
        );
        let tls = ClientTls {
            trust: Trust::default(),
            client_auth: Some(crate::tls::ClientAuth {
                cert_file: missing,
                key_file: missing,
            }),
        };
        let err = crate::store::PgStore::open_read_only(url, 1, tls)
            .await
            .err()
            .expect("refused");
        assert!(err.to_string().contains("store.client_cert_file"), "{err}");
        // Without sslmode=require the certificate would never be sent.
        let plain = "postgres://tg@127.0.0.1:9/db";
        let err = crate::store::PgStore::probe(plain, tls)
            .await
            .err()
            .expect("refused");
        assert!(err.to_string().contains("sslmode=require"), "{err}");
    }
}
