//! The MCP endpoint's listening sockets: one per serving thread (`gateway.threads`), bound to
//! the same address with `SO_REUSEPORT`, so the kernel spreads new connections over the
//! threads and each thread accepts on a socket of its own (no shared accept queue, no thundering
//! herd).
//!
//! Why threads of their own (issue 15): on tokio's work-stealing runtime a request's task, its
//! client connection and its upstream connection are polled by whichever worker the I/O driver
//! or a steal hands them to, so an exchange crosses threads several times (measured with
//! `strace -c`: 2.5 futex calls per small `tools/call`). With one single-threaded runtime per
//! thread, a connection, the upstream exchanges it causes and the pooled upstream connections
//! they use ([`crate::upstream::h1::pool`] keeps idle connections per thread) stay on one thread,
//! like nginx's workers. The figures are in `benches/RESULTS.md`.
//!
//! `SO_REUSEPORT` lets any socket of the same user join the group, so a second process bound to
//! the same port would silently take a share of the connections. [`bind_group`] therefore first
//! binds the address without it: if another socket holds the address, that bind fails with
//! `EADDRINUSE`, as a plain listener would.

use socket2::{Domain, Protocol, Socket, Type};
use std::io;
use std::net::{SocketAddr, TcpListener};

/// Pending connections a socket queues before the thread accepts them (the kernel caps it at
/// `net.core.somaxconn`).
const BACKLOG: i32 = 1024;

/// Binds `count` (at least 1) non-blocking listening sockets to `addr` with `SO_REUSEPORT` (one
/// socket when `count` is 1: then without it). Port 0 picks one free port for all of them.
///
/// Errors: the OS error of the first bind that failed, `EADDRINUSE` when another socket holds
/// `addr` (with or without `SO_REUSEPORT`).
pub fn bind_group(addr: SocketAddr, count: usize) -> io::Result<Vec<TcpListener>> {
    let count = count.max(1);
    if count == 1 {
        return Ok(vec![bind_one(addr, false)?]);
    }
    let first = if addr.port() == 0 {
        // A port the kernel picks is free: no other socket can be in a group with it.
        bind_one(addr, true)?
    } else {
        // Held only while the group binds: the group's sockets are then the address's only ones.
        drop(bind_one(addr, false)?);
        bind_one(addr, true)?
    };
    let addr = first.local_addr()?;
    let mut group = vec![first];
    for _ in 1..count {
        group.push(bind_one(addr, true)?);
    }
    Ok(group)
}

fn bind_one(addr: SocketAddr, reuse_port: bool) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    // As tokio's `TcpListener::bind`: a restart can bind while old connections are in TIME_WAIT.
    socket.set_reuse_address(true)?;
    if reuse_port {
        socket.set_reuse_port(true)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    Ok(socket.into())
}

/// The number of serving threads for `gateway.threads`: the configured number, or with 0 one
/// per CPU this process may use.
pub fn serving_threads(configured: usize) -> usize {
    match configured {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_on_port_zero_shares_one_port() {
        let group = bind_group("127.0.0.1:0".parse().unwrap(), 3).unwrap();
        let ports: Vec<u16> = group
            .iter()
            .map(|l| l.local_addr().unwrap().port())
            .collect();
        assert_eq!(ports.len(), 3);
        assert!(ports.iter().all(|p| *p == ports[0] && *p != 0));
    }

    #[test]
    fn an_address_held_by_another_listener_is_refused() {
        // A plain listener, as another process would hold the port.
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let err = bind_group(addr, 2).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
        // And a group another taskgate bound with SO_REUSEPORT is refused too.
        let other = bind_group("127.0.0.1:0".parse().unwrap(), 2).unwrap();
        let err = bind_group(other[0].local_addr().unwrap(), 2).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
    }
}
