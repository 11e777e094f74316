//! A pooled connection's byte stream: plain TCP for an `http://` upstream, TLS over TCP for an
//! `https://` one ([`Tls`]: rustls, the server's certificate chain and host name verified,
//! `http/1.1` offered by ALPN). The gate, the chunked body reader and the pool see one type
//! either way.
//!
//! A server that closes the TCP connection without TLS's close_notify (Python's `ssl` sockets
//! do, many servers after `Connection: close`) ends the stream as a plain one would: rustls's
//! `UnexpectedEof` ("peer closed connection without sending TLS close_notify") is read as the
//! end. Otherwise a body delimited by the connection's end (no length, not chunked) failed
//! over TLS where it ends cleanly over TCP (found by the cold review). A body with a length or
//! chunked framing still tells a cut from an end: hyper and [`super::chunked`] take an end
//! before it as an error. Only a connection-delimited body could be cut unseen, as over TCP.
//!
//! Why an enum and not a boxed `dyn AsyncRead + AsyncWrite`: a plain connection (the sidecar's
//! case, and every benchmark's) pays one branch per read and write, no virtual call and no
//! allocation; the TLS stream (about 1 KiB of rustls state) is boxed so a plain one stays the
//! size of a `TcpStream`.

use rustls_pki_types::ServerName;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// The stream of one upstream connection.
pub(crate) enum Io {
    /// `http://`.
    Plain(TcpStream),
    /// `https://`, after its handshake.
    Tls(Box<TlsStream<TcpStream>>),
}

/// How connections to an `https://` upstream are made secure: the rustls client settings
/// (`crate::tls::client_config`) and the name its certificate must carry (the URL's host: a
/// DNS name, or an IP address, which the certificate must then list as such).
#[derive(Clone)]
pub struct Tls {
    connector: TlsConnector,
    server_name: ServerName<'static>,
}

impl Tls {
    /// TLS to `host` (the URL's host, without brackets for IPv6) trusting `trust` (see
    /// `crate::tls`: `upstream.ca_file`, `upstream.ca_roots`), presenting `client_auth` when the
    /// server asks for a client certificate.
    ///
    /// Errors: `host` is not a DNS name or IP address; a file cannot be used, or the system
    /// trust store holds no certificate (the message names the `upstream.` key).
    pub fn new(
        host: &str,
        trust: crate::tls::Trust<'_>,
        client_auth: Option<crate::tls::ClientAuth<'_>>,
    ) -> Result<Tls, String> {
        let server_name = ServerName::try_from(host.to_string())
            .map_err(|e| format!("{host:?} cannot be checked against a certificate: {e}"))?;
        let config = crate::tls::client_config("upstream", trust, client_auth, &[b"http/1.1"])?;
        Ok(Tls {
            connector: TlsConnector::from(Arc::new(config)),
            server_name,
        })
    }

    /// The TLS handshake on `tcp`. Errors: the handshake's (an untrusted or expired
    /// certificate, a name it does not carry, a server that does not speak TLS).
    pub(super) async fn connect(&self, tcp: TcpStream) -> io::Result<Io> {
        let tls = self
            .connector
            .connect(self.server_name.clone(), tcp)
            .await?;
        Ok(Io::Tls(Box::new(tls)))
    }
}

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => match Pin::new(s.as_mut()).poll_read(cx, buf) {
                // The server closed the TCP connection without close_notify: the end of the
                // stream, as over plain TCP (see the module docs).
                Poll::Ready(Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    Poll::Ready(Ok(()))
                }
                other => other,
            },
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
