//! The floor of a hyper-based proxy, for taskgate's benchmark (issue 15): a transparent HTTP/1
//! reverse proxy built the way taskgate's data path is (one current-thread tokio runtime per
//! serving thread, each accepting on its own `SO_REUSEPORT` socket; hyper 1's HTTP/1 server;
//! upstream connections by `hyper::client::conn::http1`, kept in a pool per thread) and doing
//! nothing else: no JSON-RPC parsing, no MCP layers, no registry. Request and response bodies
//! stream through untouched (an SSE answer is relayed frame by frame, as hyper reads it).
//!
//! What it measures: the CPU a proxy pays for hyper and tokio alone. taskgate's CPU per request
//! minus this one's is what taskgate's own work (MCP handling, tasks, the registry) costs; this
//! one's against nginx's is what the HTTP library and runtime cost.
//!
//! `hyperproxy --upstream HOST:PORT [--listen 127.0.0.1:0] [--threads N]` (N: default one per CPU)
//! prints `{"listening":"ADDR"}` once bound, then serves until killed. Hop-by-hop request headers
//! (`Connection`, `Keep-Alive`, `Proxy-Connection`, `TE`, `Upgrade`) are dropped, as nginx's
//! `proxy_set_header Connection ""` does; an unreachable upstream is answered 502.

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Empty};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::cell::RefCell;
use std::io::Write;
use std::net::SocketAddr;
use tokio::net::{TcpListener, TcpStream};

/// Idle upstream connections kept per serving thread.
const POOL_MAX: usize = 256;

thread_local! {
    static POOL: RefCell<Vec<SendRequest<Incoming>>> = const { RefCell::new(Vec::new()) };
}

type Out = BoxBody<Bytes, hyper::Error>;

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn bind(addr: SocketAddr, reuse_port: bool) -> std::net::TcpListener {
    use socket2::{Domain, Protocol, Socket, Type};
    let s =
        Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP)).expect("socket");
    s.set_reuse_address(true).expect("SO_REUSEADDR");
    if reuse_port {
        s.set_reuse_port(true).expect("SO_REUSEPORT");
    }
    s.set_nonblocking(true).expect("non-blocking");
    s.bind(&addr.into()).expect("bind");
    s.listen(1024).expect("listen");
    s.into()
}

/// An idle pooled sender that can take a request now, or a new connection.
async fn sender(upstream: SocketAddr) -> Result<SendRequest<Incoming>, String> {
    let pooled = POOL.with(|p| {
        let mut p = p.borrow_mut();
        p.retain(|s| !s.is_closed());
        let i = p.iter().position(|s| s.is_ready())?;
        Some(p.swap_remove(i))
    });
    if let Some(s) = pooled {
        return Ok(s);
    }
    let stream = TcpStream::connect(upstream)
        .await
        .map_err(|e| e.to_string())?;
    let _ = stream.set_nodelay(true);
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    Ok(send)
}

async fn forward(upstream: SocketAddr, mut req: Request<Incoming>) -> Response<Out> {
    for h in [
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "upgrade",
    ] {
        req.headers_mut().remove(h);
    }
    let answer = async {
        let mut send = sender(upstream).await?;
        let reply = send.send_request(req).await.map_err(|e| e.to_string())?;
        // Back to the pool at once: it is ready again when this response's body has ended.
        POOL.with(|p| {
            let mut p = p.borrow_mut();
            if p.len() < POOL_MAX {
                p.push(send);
            }
        });
        Ok::<_, String>(reply)
    }
    .await;
    match answer {
        Ok(reply) => reply.map(|b| b.boxed()),
        Err(e) => {
            eprintln!("upstream: {e}");
            let mut r = Response::new(Empty::new().map_err(|n| match n {}).boxed());
            *r.status_mut() = StatusCode::BAD_GATEWAY;
            r
        }
    }
}

fn serve(listener: std::net::TcpListener, upstream: SocketAddr) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async move {
        let listener = TcpListener::from_std(listener).expect("listener");
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            };
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| async move {
                    Ok::<_, std::convert::Infallible>(forward(upstream, req).await)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let listen: SocketAddr = arg(&args, "--listen")
        .unwrap_or_else(|| "127.0.0.1:0".into())
        .parse()
        .expect("--listen ADDR");
    let upstream: SocketAddr = arg(&args, "--upstream")
        .expect("--upstream HOST:PORT")
        .parse()
        .expect("--upstream HOST:PORT");
    let threads: usize = arg(&args, "--threads")
        .map(|t| t.parse().expect("--threads N"))
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let first = bind(listen, threads > 1);
    let addr = first.local_addr().expect("bound");
    let mut listeners = vec![first];
    for _ in 1..threads {
        listeners.push(bind(addr, true));
    }
    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(
            out,
            "{}",
            serde_json::json!({ "listening": addr.to_string() })
        );
        let _ = out.flush();
    }
    let handles: Vec<_> = listeners
        .into_iter()
        .enumerate()
        .map(|(i, l)| {
            std::thread::Builder::new()
                .name(format!("hp-serve-{i}"))
                .spawn(move || serve(l, upstream))
                .expect("thread")
        })
        .collect();
    for h in handles {
        let _ = h.join();
    }
}
