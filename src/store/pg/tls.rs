//! TLS to the database: rustls (the ring provider taskgate already uses for OAuth) through
//! `tokio-postgres-rustls`.
//!
//! TLS is used when the URL says `sslmode=require`, and then always (a server without TLS is
//! refused; never a fall-back to plain text), with the server's certificate chain **and host
//! name** verified (what libpq calls `verify-full`) against `store.ca_file` when set (PEM, one or
//! more CA certificates: a private CA, a managed database's CA bundle) or else the Mozilla roots
//! (`webpki-roots`). There is no "encrypt but trust anyone". `sslmode=disable` and `prefer` (the
//! driver's default) connect in plain text, as taskgate always did before TLS: libpq's `prefer`
//! encrypts without verifying anything, and verifying there would have refused, on upgrade, every
//! server with a certificate outside the roots (found by review).

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use std::path::Path;
use std::sync::Arc;
use tokio_postgres_rustls::MakeRustlsConnect;

/// Whether connections use TLS: `sslmode=require` (see the module docs).
pub(super) fn wanted(config: &tokio_postgres::Config) -> bool {
    config.get_ssl_mode() == tokio_postgres::config::SslMode::Require
}

/// The connector for connections to the database, trusting the CA certificates in `ca_file`
/// (PEM) or, without one, the Mozilla roots.
///
/// Errors: a message naming the file when it cannot be read, holds no certificate, or holds one
/// rustls cannot use.
pub(super) fn connector(ca_file: Option<&Path>) -> Result<MakeRustlsConnect, String> {
    let mut roots = rustls::RootCertStore::empty();
    match ca_file {
        Some(path) => {
            let shown = path.display();
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| format!("store.ca_file {shown}: {e}"))?;
            for cert in certs {
                let cert = cert.map_err(|e| format!("store.ca_file {shown}: {e}"))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("store.ca_file {shown}: {e}"))?;
            }
            if roots.is_empty() {
                return Err(format!(
                    "store.ca_file {shown}: no PEM certificate in the file"
                ));
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_file_without_certificates_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("ca.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let err = connector(Some(&empty)).err().expect("refused");
        assert!(
            err.contains("ca.pem") && err.contains("no PEM certificate"),
            "{err}"
        );
        let missing = dir.path().join("missing.pem");
        let err = connector(Some(&missing)).err().expect("refused");
        assert!(err.contains("missing.pem"), "{err}");
        assert!(connector(None).is_ok());
    }
}
