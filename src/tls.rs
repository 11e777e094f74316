//! TLS client settings shared by every connection taskgate opens with TLS: to an `https://`
//! upstream (`upstream::h1`) and to PostgreSQL with `sslmode=require` (`store::pg`). rustls
//! with the ring provider (the one OAuth's key-set fetches use: one crypto provider in the
//! binary), TLS 1.2 and 1.3, the server's certificate chain and host name always verified.
//! There is no "encrypt but trust anyone".
//!
//! The roots: the CA certificates of a PEM file (`upstream.ca_file`, `store.ca_file`: a private
//! CA, a managed service's bundle) instead of, not beside, the Mozilla roots (`webpki-roots`)
//! taken without one. A leaf: it names nothing of taskgate.

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use std::path::Path;
use std::sync::Arc;

/// A rustls client configuration trusting the CA certificates in `ca_file` (PEM, one or more)
/// or, without one, the Mozilla roots, offering `alpn` (ALPN protocol ids, e.g. `http/1.1`;
/// empty: no ALPN).
///
/// Errors: a message naming `key` (the config key, e.g. `store.ca_file`) and the file when it
/// cannot be read, holds no certificate, or holds one rustls cannot use.
pub fn client_config(
    key: &str,
    ca_file: Option<&Path>,
    alpn: &[&[u8]],
) -> Result<rustls::ClientConfig, String> {
    let mut roots = rustls::RootCertStore::empty();
    match ca_file {
        Some(path) => {
            let shown = path.display();
            let certs =
                CertificateDer::pem_file_iter(path).map_err(|e| format!("{key} {shown}: {e}"))?;
            for cert in certs {
                let cert = cert.map_err(|e| format!("{key} {shown}: {e}"))?;
                roots.add(cert).map_err(|e| format!("{key} {shown}: {e}"))?;
            }
            if roots.is_empty() {
                return Err(format!("{key} {shown}: no PEM certificate in the file"));
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_file_that_cannot_be_used_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("ca.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let err = client_config("upstream.ca_file", Some(&empty), &[]).unwrap_err();
        assert!(
            err.contains("upstream.ca_file") && err.contains("ca.pem"),
            "{err}"
        );
        assert!(err.contains("no PEM certificate"), "{err}");
        let missing = dir.path().join("missing.pem");
        let err = client_config("store.ca_file", Some(&missing), &[]).unwrap_err();
        assert!(
            err.contains("store.ca_file") && err.contains("missing.pem"),
            "{err}"
        );
    }

    #[test]
    fn alpn_is_offered_as_given() {
        let c = client_config("k", None, &[b"http/1.1"]).unwrap();
        assert_eq!(c.alpn_protocols, vec![b"http/1.1".to_vec()]);
    }
}
