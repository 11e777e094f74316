//! [`Blip`]: a TCP proxy in front of an upstream whose reachability a test interrupts, as a
//! network blip or a restarted proxy does (tester 5 #3: `recproxy.py` killed and started again
//! 1.5 s later). [`Blip::down`] cuts every open connection and closes the listening socket, so
//! a new connection is refused; [`Blip::up`] listens again on the same port. The upstream
//! behind it runs on, its tasks and sessions kept.

use super::*;

/// A TCP proxy on 127.0.0.1 to one upstream (see the module docs).
pub struct Blip {
    pub addr: SocketAddr,
    target: SocketAddr,
    running: tokio::sync::Mutex<Option<Running>>,
}

/// The proxy while it listens: its accept loop and the connections it relays.
struct Running {
    accept: tokio::task::JoinHandle<()>,
    conns: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl Blip {
    /// A proxy on a port of its own, listening, in front of `target`.
    pub async fn start(target: SocketAddr) -> Blip {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the blip proxy");
        let addr = listener.local_addr().unwrap();
        Blip {
            addr,
            target,
            running: tokio::sync::Mutex::new(Some(relay(listener, target))),
        }
    }

    /// `http://127.0.0.1:PORT/mcp`: the upstream's MCP URL through the proxy.
    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    /// Cuts every open connection and stops listening: returns once the port refuses
    /// connections.
    pub async fn down(&self) {
        let Some(Running { accept, conns }) = self.running.lock().await.take() else {
            return;
        };
        accept.abort();
        let _ = accept.await;
        let conns: Vec<_> = conns.lock().unwrap().drain(..).collect();
        for c in conns {
            c.abort();
            let _ = c.await;
        }
    }

    /// Listens again on the same port.
    pub async fn up(&self) {
        let mut running = self.running.lock().await;
        if running.is_some() {
            return;
        }
        let listener = tokio::net::TcpListener::bind(self.addr)
            .await
            .expect("bind the blip proxy's port again");
        *running = Some(relay(listener, self.target));
    }
}

/// Accepts on `listener` and relays each connection to `target` (a connection `target`
/// refuses is closed).
fn relay(listener: tokio::net::TcpListener, target: SocketAddr) -> Running {
    let conns: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>> = Arc::default();
    let kept = conns.clone();
    let accept = tokio::spawn(async move {
        loop {
            let Ok((mut client, _)) = listener.accept().await else {
                continue;
            };
            let conn = tokio::spawn(async move {
                if let Ok(mut server) = tokio::net::TcpStream::connect(target).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
            let mut conns = kept.lock().unwrap();
            conns.retain(|c| !c.is_finished());
            conns.push(conn);
        }
    });
    Running { accept, conns }
}
