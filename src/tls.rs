//! TLS client settings shared by every connection taskgate opens with TLS: to an `https://`
//! upstream (`upstream::h1`) and to PostgreSQL with `sslmode=require` (`store::pg`). rustls
//! with the ring provider (the one OAuth's key-set fetches use: one crypto provider in the
//! binary), TLS 1.2 and 1.3, the server's certificate chain and host name always verified.
//! There is no "encrypt but trust anyone".
//!
//! The roots ([`Trust`]): a named set, `ca_roots` ([`CaRoots`]: the Mozilla roots of
//! `webpki-roots`, or the platform's trust store through `rustls-native-certs`, which on Linux
//! reads the OpenSSL bundle and directory, or `SSL_CERT_FILE` / `SSL_CERT_DIR` when set), and
//! the CA certificates of a PEM file, `ca_file` (a private CA, a managed service's bundle).
//! Without `ca_roots` a `ca_file` is trusted alone, instead of the Mozilla roots (as before
//! `ca_roots` existed); with both, the file's CAs are trusted beside the set. Neither: Mozilla.
//!
//! A connection may also present a client certificate (mTLS: `upstream.client_cert_file` and
//! `upstream.client_key_file`, `store.client_cert_file` and `store.client_key_file`,
//! [`ClientAuth`]; both halves of one connection's settings: [`ClientTls`]). A leaf: it names
//! nothing else of taskgate.

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;
use std::path::Path;
use std::sync::Arc;

/// `ca_roots`: a named set of trusted root CAs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CaRoots {
    /// The Mozilla roots compiled into taskgate (`webpki-roots`): the same on every machine.
    Mozilla,
    /// The platform's trust store (`rustls-native-certs`; on Linux `SSL_CERT_FILE` /
    /// `SSL_CERT_DIR` when set, else the distribution's bundle and directory), read at start:
    /// a private or TLS-inspecting CA installed in the OS is trusted.
    System,
}

/// What a connection's server certificate must chain to (see the module docs).
#[derive(Debug, Clone, Copy, Default)]
pub struct Trust<'a> {
    /// A PEM file of CA certificates (`ca_file`).
    pub ca_file: Option<&'a Path>,
    /// A named set (`ca_roots`); `None`: Mozilla's without `ca_file`, none beside it.
    pub ca_roots: Option<CaRoots>,
}

impl<'a> Trust<'a> {
    /// The CA certificates of `ca_file` alone.
    pub fn file(ca_file: &'a Path) -> Trust<'a> {
        Trust {
            ca_file: Some(ca_file),
            ca_roots: None,
        }
    }
}

/// The client certificate a connection presents when the server asks for one (mTLS): a PEM
/// certificate chain (the client's own first) and its PEM private key (PKCS#8, PKCS#1 or SEC1).
#[derive(Debug, Clone, Copy)]
pub struct ClientAuth<'a> {
    /// The PEM certificate chain (`client_cert_file`).
    pub cert_file: &'a Path,
    /// Its PEM private key (`client_key_file`).
    pub key_file: &'a Path,
}

/// One connection's TLS settings: what the server's certificate must chain to, and the client
/// certificate presented when the server asks for one. A bare [`Trust`] converts into it (no
/// client certificate).
#[derive(Debug, Clone, Copy, Default)]
pub struct ClientTls<'a> {
    /// The roots (`ca_file`, `ca_roots`).
    pub trust: Trust<'a>,
    /// The client certificate and key (`client_cert_file`, `client_key_file`), if any.
    pub client_auth: Option<ClientAuth<'a>>,
}

impl<'a> From<Trust<'a>> for ClientTls<'a> {
    fn from(trust: Trust<'a>) -> ClientTls<'a> {
        ClientTls {
            trust,
            client_auth: None,
        }
    }
}

impl<'a> ClientAuth<'a> {
    /// The client certificate of `client_cert_file` and `client_key_file` when both are set
    /// (`upstream.*`, `store.*`; the config check refuses one without the other).
    pub fn of(cert_file: Option<&'a Path>, key_file: Option<&'a Path>) -> Option<ClientAuth<'a>> {
        Some(ClientAuth {
            cert_file: cert_file?,
            key_file: key_file?,
        })
    }
}

/// A rustls client configuration trusting `trust`, presenting `client_auth` when set, offering
/// `alpn` (ALPN protocol ids, e.g. `http/1.1`; empty: no ALPN).
///
/// `section` prefixes the config keys the errors name (`upstream`, `upstream[0]`, `store`).
///
/// Errors: a message naming the key and the file when a file cannot be read, holds no
/// certificate (or no key), or holds one rustls cannot use; `ca_roots = "system"` when the
/// platform's store yields no certificate (never a silent "trust nothing").
pub fn client_config(
    section: &str,
    trust: Trust<'_>,
    client_auth: Option<ClientAuth<'_>>,
    alpn: &[&[u8]],
) -> Result<rustls::ClientConfig, String> {
    let mut roots = rustls::RootCertStore::empty();
    match (trust.ca_roots, trust.ca_file) {
        (Some(CaRoots::Mozilla), _) | (None, None) => {
            roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned())
        }
        (Some(CaRoots::System), _) => add_system_roots(section, &mut roots)?,
        (None, Some(_)) => {}
    }
    if let Some(path) = trust.ca_file {
        let key = format!("{section}.ca_file");
        let shown = path.display();
        let before = roots.len();
        let certs =
            CertificateDer::pem_file_iter(path).map_err(|e| format!("{key} {shown}: {e}"))?;
        for cert in certs {
            let cert = cert.map_err(|e| format!("{key} {shown}: {e}"))?;
            roots.add(cert).map_err(|e| format!("{key} {shown}: {e}"))?;
        }
        if roots.len() == before {
            return Err(format!("{key} {shown}: no PEM certificate in the file"));
        }
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots);
    let mut config = match client_auth {
        None => builder.with_no_client_auth(),
        Some(auth) => {
            let (chain, key) = client_identity(section, auth)?;
            builder.with_client_auth_cert(chain, key).map_err(|e| {
                format!(
                    "{section}.client_cert_file {} / {section}.client_key_file {}: {e}",
                    auth.cert_file.display(),
                    auth.key_file.display()
                )
            })?
        }
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// The platform's trust store into `roots`. Errors: it yields no certificate rustls can use
/// (the message says where it looked and what failed).
fn add_system_roots(section: &str, roots: &mut rustls::RootCertStore) -> Result<(), String> {
    let found = rustls_native_certs::load_native_certs();
    let (added, ignored) = roots.add_parsable_certificates(found.certs);
    let errors: Vec<String> = found.errors.iter().map(|e| e.to_string()).collect();
    if added == 0 {
        let looked = looked_in(
            std::env::var_os("SSL_CERT_FILE").as_deref(),
            std::env::var_os("SSL_CERT_DIR").as_deref(),
        );
        let why = if errors.is_empty() {
            String::new()
        } else {
            format!(": {}", errors.join("; "))
        };
        return Err(format!(
            "{section}.ca_roots = \"system\": no usable CA certificate found in {looked} \
             ({ignored} unusable){why}; install the CA certificates (e.g. the ca-certificates \
             package), point SSL_CERT_FILE at a PEM bundle, or use ca_roots = \"mozilla\" / ca_file"
        ));
    }
    if !errors.is_empty() {
        tracing::warn!(
            key = %format!("{section}.ca_roots"),
            trusted = added,
            errors = %errors.join("; "),
            "parts of the system trust store could not be read"
        );
    }
    Ok(())
}

/// Where `rustls-native-certs` looked, given `SSL_CERT_FILE` and `SSL_CERT_DIR`: as it does, a
/// set `SSL_CERT_FILE` counts even when empty, an `SSL_CERT_DIR` by its non-empty entries; with
/// either, the platform's own bundle and directory are not read.
fn looked_in(file: Option<&std::ffi::OsStr>, dir: Option<&std::ffi::OsStr>) -> String {
    let file = file.map(|p| format!("SSL_CERT_FILE={:?}", p.to_string_lossy()));
    let dir = dir
        .filter(|d| std::env::split_paths(d).any(|p| !p.as_os_str().is_empty()))
        .map(|d| format!("SSL_CERT_DIR={:?}", d.to_string_lossy()));
    let env: Vec<String> = file.into_iter().chain(dir).collect();
    if env.is_empty() {
        "the platform's trust store".to_string()
    } else {
        env.join(", ")
    }
}

/// The certificate chain and private key of `auth`. Errors: either file cannot be read or holds
/// no certificate / no private key (named by key and path).
fn client_identity(
    section: &str,
    auth: ClientAuth<'_>,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), String> {
    let (cert_key, cert_shown) = (
        format!("{section}.client_cert_file"),
        auth.cert_file.display(),
    );
    let chain = CertificateDer::pem_file_iter(auth.cert_file)
        .map_err(|e| format!("{cert_key} {cert_shown}: {e}"))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{cert_key} {cert_shown}: {e}"))?;
    if chain.is_empty() {
        return Err(format!(
            "{cert_key} {cert_shown}: no PEM certificate in the file"
        ));
    }
    let (key_key, key_shown) = (
        format!("{section}.client_key_file"),
        auth.key_file.display(),
    );
    let key = PrivateKeyDer::from_pem_file(auth.key_file).map_err(|e| match e {
        rustls_pki_types::pem::Error::NoItemsFound => {
            format!("{key_key} {key_shown}: no PEM private key in the file")
        }
        e => format!("{key_key} {key_shown}: {e}"),
    })?;
    Ok((chain, key))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/tls")
            .join(name)
    }

    #[test]
    fn a_ca_file_that_cannot_be_used_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("ca.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let err = client_config("upstream", Trust::file(&empty), None, &[]).unwrap_err();
        assert!(
            err.contains("upstream.ca_file") && err.contains("ca.pem"),
            "{err}"
        );
        assert!(err.contains("no PEM certificate"), "{err}");
        let missing = dir.path().join("missing.pem");
        let err = client_config("store", Trust::file(&missing), None, &[]).unwrap_err();
        assert!(
            err.contains("store.ca_file") && err.contains("missing.pem"),
            "{err}"
        );
        // Beside a root set, a file without a certificate is refused all the same.
        let beside = Trust {
            ca_file: Some(&empty),
            ca_roots: Some(CaRoots::Mozilla),
        };
        let err = client_config("upstream", beside, None, &[]).unwrap_err();
        assert!(err.contains("no PEM certificate"), "{err}");
    }

    /// The refusal of an empty system store names what `rustls-native-certs` read: a set
    /// `SSL_CERT_FILE` is read even when empty (then nothing else is: the platform's bundle
    /// is not), an `SSL_CERT_DIR` only for its non-empty entries. Before: an empty
    /// `SSL_CERT_FILE` was left out and the error blamed "the platform's trust store", which
    /// had not been read.
    #[test]
    fn the_system_store_refusal_names_what_was_read() {
        use std::ffi::OsStr;
        let os = |s: &'static str| Some(OsStr::new(s));
        assert_eq!(looked_in(None, None), "the platform's trust store");
        assert_eq!(looked_in(os(""), None), "SSL_CERT_FILE=\"\"");
        assert_eq!(looked_in(None, os("")), "the platform's trust store");
        assert_eq!(looked_in(None, os(":")), "the platform's trust store");
        assert_eq!(
            looked_in(os("/a.pem"), os("/d:/e")),
            "SSL_CERT_FILE=\"/a.pem\", SSL_CERT_DIR=\"/d:/e\""
        );
    }

    #[test]
    fn alpn_is_offered_as_given() {
        let c = client_config("k", Trust::default(), None, &[b"http/1.1"]).unwrap();
        assert_eq!(c.alpn_protocols, vec![b"http/1.1".to_vec()]);
    }

    /// A client certificate and key that rustls can use give a configuration that offers one;
    /// a missing file, a file without a key, and a key of another certificate are named.
    #[test]
    fn a_client_identity_is_loaded_or_its_files_are_named() {
        let cert = fixture("client.pem");
        let key = fixture("client.key");
        let auth = ClientAuth {
            cert_file: &cert,
            key_file: &key,
        };
        let c = client_config("upstream", Trust::default(), Some(auth), &[]).unwrap();
        assert!(c.client_auth_cert_resolver.has_certs());
        let plain = client_config("upstream", Trust::default(), None, &[]).unwrap();
        assert!(!plain.client_auth_cert_resolver.has_certs());

        let no_key = ClientAuth {
            cert_file: &cert,
            key_file: &cert,
        };
        let err = client_config("upstream[0]", Trust::default(), Some(no_key), &[]).unwrap_err();
        assert!(
            err.contains("upstream[0].client_key_file") && err.contains("no PEM private key"),
            "{err}"
        );
        let other_key = fixture("other.key");
        let mismatched = ClientAuth {
            cert_file: &cert,
            key_file: &other_key,
        };
        let err = client_config("upstream", Trust::default(), Some(mismatched), &[]).unwrap_err();
        assert!(err.contains("upstream.client_cert_file"), "{err}");
        let missing = fixture("missing.pem");
        let gone = ClientAuth {
            cert_file: &missing,
            key_file: &key,
        };
        let err = client_config("upstream", Trust::default(), Some(gone), &[]).unwrap_err();
        assert!(
            err.contains("upstream.client_cert_file") && err.contains("missing.pem"),
            "{err}"
        );
    }
}
