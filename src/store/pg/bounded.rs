//! No store call waits for the database forever: each one's queries run under the query timeout,
//! and a connection that did not answer in time is closed, never given back to the pool.
//!
//! **What can leave a query unanswered**: a database host that stops answering with the network
//! dropping packets (no RST: TCP itself retransmits for many minutes before it gives up), and a
//! peer that keeps the TCP connection up but does not answer (a stopped or stuck server, a
//! proxy such as PgBouncer or HAProxy in front of one that is unreachable).
//!
//! **Measured** (PostgreSQL 15, psql/libpq, which sets the same socket options tokio-postgres
//! does; packets to the server dropped by `iptables` in a private network namespace after the
//! connection was made, then `SELECT 2`): with the defaults the query had no answer after 40 s
//! (killed then); with `tcp_user_timeout=3000` it failed after 3.5 s ("connection to server was
//! lost"); with keepalives at 1 s idle/1 s interval/2 probes and no user timeout it still hung
//! (Linux sends no keepalive probe while sent data waits for its ACK); with the server-side
//! `statement_timeout` of 3 s it hung too (the server never got the statement). The same through
//! this store (`PgStore::get` with `connect_timeout=2`, packets dropped the same way): before
//! this bound, no answer after 60 s; with `tcp_user_timeout` alone, "connection closed" after
//! 2.4 s; with both, this module's error after 2.0 s. Against a peer
//! that ACKs but does not answer (the test suite's black-hole proxy: `tests/store_unanswered.rs`)
//! the TCP options never fire, and `statement_timeout` only helps when the server itself is
//! there to enforce it.
//!
//! **So**: the connection's `tcp_user_timeout` is set to the query timeout (unless the URL sets
//! its own; Linux only): the kernel ends a connection whose sent data goes unacknowledged that
//! long, also on the paths not bounded here (the migrations at start).
//! And every store call's work runs under [`tokio::time::timeout`] here ([`bounded`]): past the
//! query timeout the call fails with [`StoreError::Db`] (the registry's "task store unavailable"
//! `-32603`, a refused creation, `taskgate_store_write_failures_total`), and its connection is
//! closed, never pooled again, so a connection stuck behind a black hole cannot hold the next
//! call up. The statement may still have run on the server (the answer was lost, not
//! necessarily the work): as with any failed call, the client tries again.
//!
//! **Which duration**: the database URL's `connect_timeout` (5 s when the URL has none): the
//! bound of the sweep lease's liveness check (see `tier`), and the reasoning is the same: an
//! answer slower than a new connection may take means the connection is lost. Every query
//! taskgate makes is one index lookup or a small transaction of them; `count_by_status` (a
//! `GROUP BY` over the table, once a sweep tick) is the largest. The clock starts once the call
//! holds a connection; getting one is bounded by the pool with the same duration (to wait for
//! a free one, and to open one), so a store call gets its answer or its error within about
//! three times `connect_timeout` (15 s by default; before issue 29 the pool's two waits were a
//! fixed 5 s each whatever the URL said). The thread that waits for a synchronous store call is
//! one of the registry's store threads, never the runtime's blocking pool (see
//! `registry::offload`).
//!
//! **Pages of records** are the exception: `list_owner` (`tasks/list`, the admin's owner
//! listing) and the scans (start-up, `/admin/tasks`, `taskgate tasks list`) read up to 500
//! records each, a record with its stored result (up to `tasks.max_stored_result_bytes`), so
//! a page legitimately takes long to arrive over a slow link. They read with
//! [`Conn::query_rows`]: the bound is on the wait for each row, so a page that keeps arriving
//! is not cut, one that stops arriving is (`tests/store_unanswered.rs`: a paced link).
//!
//! `check-config`'s probe (`PgStore::probe`, one connection outside the pool) bounds each of
//! its steps the same way (the connection's start-up twice: its TCP connect has the first), so
//! a server that accepts the connection and never answers fails it in time.
//!
//! **Not bounded here**: the migrations at start (their advisory lock waits, rightly, for
//! another replica's migrations; `tcp_user_timeout` still ends a black-holed connection) and
//! the sweep lease (its liveness check and lock query have bounds of their own, see `tier`).

use super::{pool_err, StoreError};
use deadpool_postgres::{Object, Pool};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// A pooled connection lent to one store call's work ([`bounded`]): back to the pool when the
/// work is dropped after it ended; closed instead when the work was abandoned at its deadline.
/// Derefs to the pool's [`Object`] (and through it to the [`tokio_postgres::Client`]).
pub(in crate::store) struct Conn {
    obj: Option<Object>,
    abandoned: Arc<AtomicBool>,
    progress: Arc<Progress>,
}

/// When the work last got part of its answer ([`Conn::query_rows`]), as milliseconds after
/// `since`.
struct Progress {
    since: Instant,
    at_ms: AtomicU64,
}

impl Progress {
    fn mark(&self) {
        let ms = u64::try_from(self.since.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.at_ms.store(ms, Ordering::SeqCst);
    }

    fn last(&self) -> Instant {
        self.since + Duration::from_millis(self.at_ms.load(Ordering::SeqCst))
    }
}

impl Conn {
    /// `query` whose rows count as progress: the bound ([`bounded`]) applies to the wait for
    /// the statement's first answer and then for each row, not to the whole answer, so a long
    /// answer that keeps arriving (a page of whole records, stored results included, over a
    /// slow link) is not cut, while one that stops arriving is.
    pub(in crate::store) async fn query_rows(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
        use futures_util::TryStreamExt;
        let rows = self.query_raw(sql, params.iter().copied()).await?;
        let mut rows = std::pin::pin!(rows);
        let mut out = Vec::new();
        while let Some(row) = rows.try_next().await? {
            self.progress.mark();
            out.push(row);
        }
        Ok(out)
    }
}

impl std::ops::Deref for Conn {
    type Target = Object;
    fn deref(&self) -> &Object {
        self.obj
            .as_ref()
            .expect("a lent connection is there until dropped")
    }
}

impl std::ops::DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut Object {
        self.obj
            .as_mut()
            .expect("a lent connection is there until dropped")
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if self.abandoned.load(Ordering::SeqCst) {
            if let Some(obj) = self.obj.take() {
                // Detached from the pool and dropped: the client goes, the connection closes.
                drop(Object::take(obj));
            }
        }
    }
}

/// Takes a connection from `pool` (bounded by the pool's own timeouts) and runs `work` with it
/// for at most `limit`, or `limit` after the last row a [`Conn::query_rows`] of it received.
/// Past that the work is dropped, its connection closed (see [`Conn`]), and the call fails
/// with [`StoreError::Db`] ("postgres: no answer within N ms …").
pub(super) async fn bounded<T, F, Fut>(
    pool: Pool,
    limit: Duration,
    work: F,
) -> Result<T, StoreError>
where
    F: FnOnce(Conn) -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let obj = pool.get().await.map_err(pool_err)?;
    let abandoned = Arc::new(AtomicBool::new(false));
    let progress = Arc::new(Progress {
        since: Instant::now(),
        at_ms: AtomicU64::new(0),
    });
    let mut job = Box::pin(work(Conn {
        obj: Some(obj),
        abandoned: abandoned.clone(),
        progress: progress.clone(),
    }));
    loop {
        match tokio::time::timeout_at(progress.last() + limit, &mut job).await {
            Ok(done) => return done,
            // Part of the answer came meanwhile ([`Conn::query_rows`]): the bound starts again.
            Err(_) if progress.last() + limit > Instant::now() => continue,
            Err(_) => break,
        }
    }
    abandoned.store(true, Ordering::SeqCst);
    drop(job);
    tracing::warn!(
        timeout_ms = limit.as_millis() as u64,
        "the database did not answer in time; its connection was closed"
    );
    Err(StoreError::Db(format!(
        "postgres: no answer within {} ms (the connection's connect_timeout); \
         the connection was closed",
        limit.as_millis()
    )))
}
