//! The HTTP/1 client of an upstream: taskgate's own [`Pool`] (the default) or `hyper_util`'s
//! pooled client, chosen once per process by the environment variable
//! `TASKGATE_UPSTREAM_CLIENT` (`pool` or `hyper-util`).
//!
//! The switch exists only for the A/B of issue 10 (`benches/run.sh` starts a second taskgate
//! with `TASKGATE_UPSTREAM_CLIENT=hyper-util`): the pool stays only if it is clearly faster. It is
//! deliberately not part of the TOML configuration and not documented for users; once the numbers
//! decide, one of the two goes away together with this switch.
//!
//! Both clients behave alike: no Nagle delay, the upstream's `connect_timeout_ms`, TCP keepalive
//! ([`KEEPALIVE_TIME`], [`KEEPALIVE_INTERVAL`]), at most [`MAX_IDLE`] idle connections kept for
//! [`IDLE_TIMEOUT`], and a request that could not be sent on a reused connection is sent again on
//! a fresh one (`hyper_util`: `retry_canceled_requests`, on by default). Only the pool caps open
//! connections ([`super::pool::MAX_CONNECTIONS`]); `hyper_util`'s client has no such cap.

use super::pool::{
    Pool, PoolError, PooledBody, IDLE_TIMEOUT, KEEPALIVE_INTERVAL, KEEPALIVE_TIME, MAX_IDLE,
};
use bytes::Bytes;
use http::{Request, Response, Uri};
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

/// The environment variable that selects the HTTP/1 client (read once per process).
pub const CLIENT_ENV: &str = "TASKGATE_UPSTREAM_CLIENT";

/// Which HTTP/1 client the upstreams use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientKind {
    /// [`Pool`]: connections driven by the request that uses them.
    Pool,
    /// `hyper_util::client::legacy::Client`: one task per connection.
    HyperUtil,
}

impl ClientKind {
    /// The kind named by [`CLIENT_ENV`] (unset: [`ClientKind::Pool`]), read at the first call.
    pub fn from_env() -> ClientKind {
        static KIND: OnceLock<ClientKind> = OnceLock::new();
        *KIND.get_or_init(|| {
            let kind = match std::env::var(CLIENT_ENV).as_deref() {
                Err(_) | Ok("") | Ok("pool") => ClientKind::Pool,
                Ok("hyper-util") => ClientKind::HyperUtil,
                Ok(other) => {
                    tracing::warn!(
                        value = other,
                        "unknown {CLIENT_ENV} (pool|hyper-util): the pool is used"
                    );
                    ClientKind::Pool
                }
            };
            tracing::info!(client = kind.name(), "upstream HTTP/1 client");
            kind
        })
    }

    /// `pool` or `hyper-util`, as in [`CLIENT_ENV`].
    pub fn name(self) -> &'static str {
        match self {
            ClientKind::Pool => "pool",
            ClientKind::HyperUtil => "hyper-util",
        }
    }
}

type Legacy = hyper_util::client::legacy::Client<HttpConnector, Full<Bytes>>;

/// One upstream's HTTP/1 client.
pub enum Client {
    /// taskgate's own pool.
    Pool(Arc<Pool>),
    /// `hyper_util`'s pooled client.
    HyperUtil(Box<Legacy>),
}

impl Client {
    /// A client of `kind` for the upstream at `authority` (`host:port`).
    pub fn new(kind: ClientKind, authority: String, connect_timeout: Duration) -> Client {
        match kind {
            ClientKind::Pool => Client::Pool(Pool::new(authority, connect_timeout)),
            ClientKind::HyperUtil => {
                let mut connector = HttpConnector::new();
                connector.set_nodelay(true);
                connector.set_connect_timeout(Some(connect_timeout));
                connector.set_keepalive(Some(KEEPALIVE_TIME));
                connector.set_keepalive_interval(Some(KEEPALIVE_INTERVAL));
                let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
                    .pool_timer(TokioTimer::new())
                    .pool_idle_timeout(IDLE_TIMEOUT)
                    .pool_max_idle_per_host(MAX_IDLE)
                    .retry_canceled_requests(true)
                    .build(connector);
                Client::HyperUtil(Box::new(client))
            }
        }
    }

    /// The request target this client wants for `url` (`http://host:port/path?q`): origin-form
    /// (`/path?q`) for the pool, the absolute URL for `hyper_util`'s client.
    pub fn target(&self, url: &Uri) -> Uri {
        match self {
            Client::Pool(_) => url
                .path_and_query()
                .map(|pq| pq.as_str())
                .unwrap_or("/")
                .parse()
                .expect("a path is a valid origin-form target"),
            Client::HyperUtil(_) => url.clone(),
        }
    }

    /// Sends `req` (its URI from [`Client::target`]) and returns the response once its head
    /// arrived.
    pub async fn send(
        &self,
        req: Request<Full<Bytes>>,
    ) -> Result<Response<UpstreamBody>, PoolError> {
        match self {
            Client::Pool(pool) => Ok(pool.send(req).await?.map(UpstreamBody::Pooled)),
            Client::HyperUtil(client) => Ok(client
                .request(req)
                .await
                .map_err(PoolError::Client)?
                .map(UpstreamBody::Incoming)),
        }
    }
}

/// The body of an upstream answer, from either client.
pub enum UpstreamBody {
    /// From the pool: drives its connection while read.
    Pooled(PooledBody),
    /// From `hyper_util`'s client (its connection task drives the connection).
    Incoming(Incoming),
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            UpstreamBody::Pooled(b) => Pin::new(b).poll_frame(cx),
            UpstreamBody::Incoming(b) => Pin::new(b).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            UpstreamBody::Pooled(b) => b.is_end_stream(),
            UpstreamBody::Incoming(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            UpstreamBody::Pooled(b) => b.size_hint(),
            UpstreamBody::Incoming(b) => b.size_hint(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::pool::tests::counting_server;
    use http_body_util::BodyExt;

    /// Both clients reuse one connection for sequential requests.
    #[tokio::test]
    async fn both_clients_reuse_a_connection() {
        for kind in [ClientKind::Pool, ClientKind::HyperUtil] {
            let server = counting_server().await;
            let client = Client::new(kind, server.addr.to_string(), Duration::from_secs(5));
            let url: Uri = format!("http://{}/mcp", server.addr).parse().unwrap();
            for _ in 0..3 {
                let req = Request::builder()
                    .uri(client.target(&url))
                    .header(http::header::HOST, server.addr.to_string())
                    .body(Full::new(Bytes::from_static(b"{}")))
                    .unwrap();
                let resp = client.send(req).await.expect("send");
                let body = resp.into_body().collect().await.unwrap().to_bytes();
                assert_eq!(&body[..], b"ok");
            }
            assert_eq!(server.accepted(), 1, "{}: one connection", kind.name());
        }
    }
}
