//! The admin listener: `/healthz` (the process answers; 503 once the task store failed for good,
//! `TaskStore::failed`, which only a restart clears), `/readyz` (every upstream accepts a
//! connection as a request's would be made, the TLS handshake of an `https://` one included, or
//! for a stdio upstream has a live child, and the task store answers: `"store": "ok"`,
//! `"unreachable: <why>"` or `"failed: <why>; restart taskgate"`;
//! `/readyz?store=optional` reports the store without counting it, a tier's probe; `upstreams=any`: ready while one upstream is up, for a tier in front of several servers), `/metrics` (Prometheus text format 0.0.4), `/admin/tasks?owner=&status=&upstream=&limit=`
//! (task records as JSON, newest first) and `/admin/tasks/<upstream>/<taskId>` (one record with
//! its audit events).
//!
//! On a stop the listener keeps serving until the gateway's drain has ended (`gateway`), so a
//! scrape during the drain sees its counts; `/readyz` answers 503 `{"ready":false,
//! "draining":true}` meanwhile, so a load balancer stops sending new requests.
//!
//! `/admin/*` shows owners (session ids in `[auth] mode = "none"`, which act as credentials
//! there). With `admin.token_env` it requires `Authorization: Bearer <token>` (401 with
//! `WWW-Authenticate` otherwise); the probes and `/metrics` (no ids in it) stay open. Without a
//! token, bind it to loopback or a network only operators and Prometheus reach (the Kubernetes
//! manifest sets a token and limits the port with a NetworkPolicy).

use super::response::json_response;
use super::server::{Body, Handler};
use crate::mcp::task::TaskStatus;
use crate::metrics::Metrics;
use crate::store::{Owner, TaskRecord, TaskStore};
use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// How `/readyz` checks an HTTP upstream: a new connection made as a request's would be
/// (`upstream::http::Readiness`: TCP, and the TLS handshake of an `https://` upstream; through
/// a proxy, TCP to the proxy). `Ok`, or why not (naming the proxy when it is the proxy).
pub type UpstreamCheck = Arc<
    dyn Fn() -> std::pin::Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync,
>;

/// An upstream as the readiness check sees it: its name and its check.
#[derive(Clone)]
pub struct UpstreamTarget {
    /// The upstream's configured name.
    pub name: String,
    /// Its check.
    pub check: UpstreamCheck,
}

/// How long `/readyz` waits for one upstream's check (a TLS handshake included).
const UPSTREAM_CHECK_WAIT: Duration = Duration::from_secs(2);

/// A readiness check that is not a TCP connect (a stdio upstream: is its child live?):
/// `Ok`, or why not.
pub type ReadinessProbe = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// The admin endpoint handler.
pub struct Admin {
    metrics: Arc<Metrics>,
    upstreams: Vec<UpstreamTarget>,
    probes: Vec<(String, ReadinessProbe)>,
    store: Arc<dyn TaskStore>,
    token_sha256: Option<[u8; 32]>,
    /// taskgate's stop signal: `true` while it drains (the admin listener serves until the
    /// drain ends; `/readyz` is 503 meanwhile, so a load balancer stops sending).
    draining: Option<tokio::sync::watch::Receiver<bool>>,
}

impl Admin {
    /// Builds the handler.
    pub fn new(
        metrics: Arc<Metrics>,
        upstreams: Vec<UpstreamTarget>,
        store: Arc<dyn TaskStore>,
    ) -> Admin {
        Admin {
            metrics,
            upstreams,
            probes: Vec::new(),
            store,
            token_sha256: None,
            draining: None,
        }
    }

    /// `/readyz` answers 503 `{"ready":false,"draining":true,…}` once `stopping` is true
    /// (taskgate's stop signal: the drain has begun).
    pub fn with_draining(mut self, stopping: tokio::sync::watch::Receiver<bool>) -> Admin {
        self.draining = Some(stopping);
        self
    }

    /// Whether taskgate is draining (stopping).
    fn is_draining(&self) -> bool {
        self.draining.as_ref().is_some_and(|d| *d.borrow())
    }

    /// Upstreams whose readiness is a probe, not a TCP connect (stdio upstreams: `"ok"` while
    /// a child is live, else `"unavailable: <why>"`).
    pub fn with_probes(mut self, probes: Vec<(String, ReadinessProbe)>) -> Admin {
        self.probes = probes;
        self
    }

    /// Requires `Authorization: Bearer <token>` on `/admin/*`, the token given by its SHA-256.
    pub fn with_token(mut self, token_sha256: Option<[u8; 32]>) -> Admin {
        self.token_sha256 = token_sha256;
        self
    }

    /// Whether the request may read `/admin/*`: no token configured, or the right one presented
    /// (compared by digest, so the time taken says nothing about the token).
    fn authorised(&self, headers: &http::HeaderMap) -> bool {
        use sha2::Digest;
        let Some(want) = &self.token_sha256 else {
            return true;
        };
        headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            // The auth scheme is case-insensitive (RFC 9110 §11.1).
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            // Indexed, not `as_slice()`, which the generic-array releases `cargo update` brings
            // deprecate.
            .is_some_and(|(_, t)| sha2::Sha256::digest(t.trim().as_bytes())[..] == want[..])
    }

    async fn serve(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        if req.method() != Method::GET {
            return json_response(
                StatusCode::METHOD_NOT_ALLOWED,
                Bytes::from_static(br#"{"error":"the admin endpoints take GET"}"#),
            );
        }
        if req.uri().path().starts_with("/admin") && !self.authorised(req.headers()) {
            let mut resp = json_response(
                StatusCode::UNAUTHORIZED,
                Bytes::from_static(
                    br#"{"error":"the admin endpoints need Authorization: Bearer <admin token> (admin.token_env)"}"#,
                ),
            );
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                http::HeaderValue::from_static("Bearer realm=\"taskgate-admin\""),
            );
            return resp;
        }
        match req.uri().path() {
            "/healthz" => self.healthz(),
            "/readyz" => match Readiness::of_query(req.uri().query().unwrap_or("")) {
                Ok(need) => self.readyz(need).await,
                Err(message) => json_response(
                    StatusCode::BAD_REQUEST,
                    serde_json::json!({ "error": message }).to_string().into(),
                ),
            },
            "/metrics" => Response::builder()
                .header(
                    header::CONTENT_TYPE,
                    "text/plain; version=0.0.4; charset=utf-8",
                )
                .body(
                    Full::new(Bytes::from(self.metrics_text()))
                        .map_err(|e| match e {})
                        .boxed_unsync(),
                )
                .expect("valid response"),
            // Store scans and reads run on the blocking pool, never on a runtime worker.
            "/admin/tasks" => {
                let query = req.uri().query().unwrap_or("").to_string();
                self.blocking(move |store| Admin::tasks(store, &query)).await
            }
            path if path.starts_with("/admin/tasks/") => {
                let rest = path["/admin/tasks/".len()..].to_string();
                let names: Vec<String> = self
                    .upstreams
                    .iter()
                    .map(|u| u.name.clone())
                    .chain(self.probes.iter().map(|(name, _)| name.clone()))
                    .collect();
                self.blocking(move |store| Admin::task(store, &rest, &names))
                    .await
            }
            other => json_response(
                StatusCode::NOT_FOUND,
                serde_json::json!({
                    "error": format!("no admin endpoint at {other:?}"),
                    "endpoints": ["/healthz", "/readyz", "/metrics", "/admin/tasks", "/admin/tasks/<upstream>/<taskId>"],
                })
                .to_string()
                .into(),
            ),
        }
    }

    /// `GET /admin/tasks?owner=&status=&upstream=&limit=`: records as JSON, newest first.
    fn tasks(store: &dyn TaskStore, query: &str) -> Response<Body> {
        let mut filter = TaskFilter::default();
        for (k, v) in form_urlencoded::parse(query.as_bytes()) {
            let v = v.into_owned();
            match k.as_ref() {
                "owner" => filter.owner = Some(v),
                "upstream" => filter.upstream = Some(v),
                "status" => match TaskStatus::parse(&v) {
                    Some(s) => filter.status = Some(s),
                    None => {
                        return json_response(
                            StatusCode::BAD_REQUEST,
                            serde_json::json!({"error": format!("unknown status {v:?}; one of working, input_required, completed, failed, cancelled")}).to_string().into(),
                        )
                    }
                },
                "limit" => match v.parse() {
                    Ok(n) => filter.limit = n,
                    Err(_) => {
                        let error = match v.parse::<i128>() {
                            Ok(_) => format!("limit must be from 0 to {}, got {v}", usize::MAX),
                            Err(_) => format!("limit must be a whole number, got {v:?}"),
                        };
                        return json_response(
                            StatusCode::BAD_REQUEST,
                            serde_json::json!({ "error": error }).to_string().into(),
                        );
                    }
                },
                other => {
                    return json_response(
                        StatusCode::BAD_REQUEST,
                        serde_json::json!({"error": format!("unknown query parameter {other:?}; use owner, status, upstream, limit")}).to_string().into(),
                    )
                }
            }
        }
        match filter.collect(store) {
            Ok(records) => json_response(
                StatusCode::OK,
                serde_json::json!({ "tasks": records }).to_string().into(),
            ),
            Err(e) => json_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                serde_json::json!({ "error": e }).to_string().into(),
            ),
        }
    }

    /// `GET /admin/tasks/<upstream>/<taskId>`: one record with its audit events; a 404 for
    /// none names the upstream when it is not one of `names` (the configured upstreams).
    fn task(store: &dyn TaskStore, rest: &str, names: &[String]) -> Response<Body> {
        let Some((upstream, task_id)) = rest.split_once('/') else {
            return json_response(
                StatusCode::NOT_FOUND,
                Bytes::from_static(br#"{"error":"use /admin/tasks/<upstream>/<taskId>"}"#),
            );
        };
        let (upstream, task_id) = (percent_decode(upstream), percent_decode(task_id));
        match task_detail(store, &upstream, &task_id) {
            Ok(Some(v)) => json_response(StatusCode::OK, v.to_string().into()),
            Ok(None) if !names.iter().any(|n| *n == upstream) => json_response(
                StatusCode::NOT_FOUND,
                serde_json::json!({"error": format!("unknown upstream {upstream:?} (configured: {}), and no task {task_id:?} recorded for it", names.join(", "))}).to_string().into(),
            ),
            Ok(None) => json_response(
                StatusCode::NOT_FOUND,
                serde_json::json!({"error": format!("no task {task_id:?} on upstream {upstream:?}")}).to_string().into(),
            ),
            Err(e) => json_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                serde_json::json!({ "error": e }).to_string().into(),
            ),
        }
    }

    /// Runs a store query on the blocking pool.
    async fn blocking<F>(&self, query: F) -> Response<Body>
    where
        F: FnOnce(&dyn TaskStore) -> Response<Body> + Send + 'static,
    {
        let store = self.store.clone();
        match tokio::task::spawn_blocking(move || query(store.as_ref())).await {
            Ok(response) => response,
            Err(e) => json_response(
                StatusCode::SERVICE_UNAVAILABLE,
                serde_json::json!({ "error": e.to_string() })
                    .to_string()
                    .into(),
            ),
        }
    }

    /// `/metrics`' text, `taskgate_store_failed` read from the store first.
    fn metrics_text(&self) -> Vec<u8> {
        self.metrics
            .store_failed
            .set(i64::from(self.store.failed().is_some()));
        self.metrics.encode()
    }

    /// `/healthz`: 200 `{"status":"ok"}` while the process can serve; 503
    /// `{"status":"failed","store":"failed: <why>; restart taskgate"}` once the task store has
    /// failed for good (`TaskStore::failed`: sled after an I/O error), so a liveness probe
    /// restarts the process (nothing short of a restart brings the store back).
    fn healthz(&self) -> Response<Body> {
        match self.store.failed() {
            None => json_response(StatusCode::OK, Bytes::from_static(br#"{"status":"ok"}"#)),
            Some(why) => json_response(
                StatusCode::SERVICE_UNAVAILABLE,
                serde_json::json!({ "status": "failed", "store": store_failed(&why) })
                    .to_string()
                    .into(),
            ),
        }
    }

    async fn readyz(&self, need: Readiness) -> Response<Body> {
        if self.is_draining() {
            // Whatever the upstreams and the store say: no new traffic while stopping.
            return json_response(
                StatusCode::SERVICE_UNAVAILABLE,
                Bytes::from_static(br#"{"ready":false,"draining":true}"#),
            );
        }
        let checks = self.upstreams.iter().map(|u| async move {
            let status = match tokio::time::timeout(UPSTREAM_CHECK_WAIT, (u.check)()).await {
                Ok(Ok(())) => "ok".to_string(),
                Ok(Err(why)) => format!("unreachable: {why}"),
                Err(_) => format!(
                    "unreachable: no connection within {} s",
                    UPSTREAM_CHECK_WAIT.as_secs()
                ),
            };
            (u.name.clone(), status)
        });
        let store = async {
            if let Some(why) = self.store.failed() {
                return store_failed(&why);
            }
            match tokio::time::timeout(Duration::from_secs(2), self.store.ping()).await {
                Ok(Ok(())) => "ok".to_string(),
                Ok(Err(e)) => format!("unreachable: {e}"),
                Err(_) => "unreachable: no answer within 2 s".to_string(),
            }
        };
        let (mut results, store) =
            futures_util::future::join(futures_util::future::join_all(checks), store).await;
        results.extend(self.probes.iter().map(|(name, probe)| {
            let status = match probe() {
                Ok(()) => "ok".to_string(),
                Err(why) => format!("unavailable: {why}"),
            };
            (name.clone(), status)
        }));
        let store_ok = store == "ok" || need.store == StoreNeed::Optional;
        let ok = |(_, s): &(String, String)| s == "ok";
        let upstreams_ok = match need.upstreams {
            UpstreamNeed::All => results.iter().all(ok),
            // None configured: nothing to wait for, as with `all`.
            UpstreamNeed::Any => results.is_empty() || results.iter().any(ok),
        };
        let ready = store_ok && upstreams_ok;
        let upstreams: serde_json::Map<String, serde_json::Value> = results
            .into_iter()
            .map(|(n, s)| (n, serde_json::Value::String(s)))
            .collect();
        let body = serde_json::json!({ "ready": ready, "upstreams": upstreams, "store": store });
        let status = if ready {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        };
        json_response(status, body.to_string().into())
    }
}

impl Handler for Admin {
    fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
        _peer: std::net::SocketAddr,
    ) -> impl Future<Output = Response<Body>> + Send + 'static {
        self.serve(req)
    }
}

/// How `/healthz` and `/readyz` name a task store that failed for good.
fn store_failed(why: &str) -> String {
    format!("failed: {why}; restart taskgate")
}

/// What `/readyz` waits for: the task store ([`StoreNeed`]) and the upstreams
/// ([`UpstreamNeed`]), from its query string (`store=required|optional`,
/// `upstreams=all|any`; a parameter given twice: the last one counts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Readiness {
    store: StoreNeed,
    upstreams: UpstreamNeed,
}

/// Whether `/readyz` needs every upstream to be up (`?upstreams=all`, the default: a sidecar
/// next to one server is not ready without it) or one of them (`?upstreams=any`).
///
/// `any` is for a tier in front of several servers: one server down would otherwise take every
/// replica alike out of the Service, and with them the servers still up; the body still names
/// each upstream's state (`"upstreams": {"<name>": "unreachable: <why>"}`), and the calls to
/// the one that is down get 502 `-32603` naming it. A stdio upstream counts as up while it has
/// a live child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum UpstreamNeed {
    All,
    Any,
}

impl Readiness {
    /// From `/readyz`'s query string; `Err` (the message for a 400) on any other parameter or
    /// value.
    fn of_query(query: &str) -> Result<Readiness, String> {
        let mut need = Readiness {
            store: StoreNeed::Required,
            upstreams: UpstreamNeed::All,
        };
        for (k, v) in form_urlencoded::parse(query.as_bytes()) {
            match (k.as_ref(), v.as_ref()) {
                ("store", "required") => need.store = StoreNeed::Required,
                ("store", "optional") => need.store = StoreNeed::Optional,
                ("store", other) => {
                    return Err(format!("store must be required or optional, got {other:?}"))
                }
                ("upstreams", "all") => need.upstreams = UpstreamNeed::All,
                ("upstreams", "any") => need.upstreams = UpstreamNeed::Any,
                ("upstreams", other) => {
                    return Err(format!("upstreams must be all or any, got {other:?}"))
                }
                (other, _) => {
                    return Err(format!(
                        "unknown parameter {other:?}; /readyz takes store=required|optional and upstreams=all|any"
                    ))
                }
            }
        }
        Ok(need)
    }
}

/// Whether `/readyz` counts the task store (`?store=required`, the default) or only reports it
/// (`?store=optional`).
///
/// `optional` is what a tier's readiness probe asks (issue 35): while the shared database is
/// unreachable every replica alike still serves plain calls and refuses task operations fast
/// with `-32603`, so taking them all out of the Service would stop the plain calls too and gain
/// nothing; the body still says `"store": "unreachable: <why>"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StoreNeed {
    Required,
    Optional,
}

/// A filter over task records, shared by `/admin/tasks` and `taskgate tasks list`.
#[derive(Debug, Clone)]
pub struct TaskFilter {
    /// Only this owner (`principal:<name>`, `session:<id>`, `anonymous`).
    pub owner: Option<String>,
    /// Only this upstream.
    pub upstream: Option<String>,
    /// Only this status.
    pub status: Option<TaskStatus>,
    /// At most this many records (default 1000).
    pub limit: usize,
}

impl Default for TaskFilter {
    fn default() -> Self {
        TaskFilter {
            owner: None,
            upstream: None,
            status: None,
            limit: 1000,
        }
    }
}

impl TaskFilter {
    /// The matching records, newest first (by `recorded_at`), at most `limit`.
    ///
    /// With both `owner` and `upstream` it pages the owner index (`by_owner`, already newest
    /// first) and reads only the records it returns. Otherwise it is one pass over the store that
    /// keeps the newest `limit` matches in a bounded heap (memory `limit` records, not the store).
    /// Errors: the store's, as text.
    pub fn collect(&self, store: &dyn TaskStore) -> Result<Vec<TaskRecord>, String> {
        if let (Some(owner), Some(upstream)) =
            (self.owner.as_deref().and_then(Owner::parse), &self.upstream)
        {
            let mut out = Vec::new();
            let mut cursor = None;
            loop {
                let (page, next) = store
                    .list_owner(upstream, &owner, cursor.as_ref(), 256)
                    .map_err(|e| e.to_string())?;
                out.extend(
                    page.into_iter()
                        .filter(|r| self.status.is_none_or(|s| s == r.status)),
                );
                if out.len() >= self.limit || next.is_none() {
                    break;
                }
                cursor = next;
            }
            out.truncate(self.limit);
            return Ok(out);
        }
        // Newest `limit` matches: a min-heap on recorded_at, the oldest kept one on top.
        let mut newest: BinaryHeap<Reverse<ByRecordedAt>> = BinaryHeap::new();
        store
            .scan(&mut |r| {
                let keep = self.owner.as_ref().is_none_or(|o| r.owner == o.as_str())
                    && self.upstream.as_ref().is_none_or(|u| *u == r.upstream)
                    && self.status.is_none_or(|s| s == r.status);
                if keep && self.limit > 0 {
                    if newest.len() < self.limit {
                        newest.push(Reverse(ByRecordedAt(r)));
                    } else if newest
                        .peek()
                        .is_some_and(|Reverse(o)| o.0.recorded_at < r.recorded_at)
                    {
                        newest.pop();
                        newest.push(Reverse(ByRecordedAt(r)));
                    }
                }
                true
            })
            .map_err(|e| e.to_string())?;
        let mut out: Vec<TaskRecord> = newest.into_iter().map(|Reverse(r)| r.0).collect();
        out.sort_by(|a, b| b.recorded_at.cmp(&a.recorded_at));
        Ok(out)
    }
}

/// A record ordered by `recorded_at` only (for the bounded heap of [`TaskFilter::collect`]).
struct ByRecordedAt(TaskRecord);

impl PartialEq for ByRecordedAt {
    fn eq(&self, other: &Self) -> bool {
        self.0.recorded_at == other.0.recorded_at
    }
}
impl Eq for ByRecordedAt {}
impl PartialOrd for ByRecordedAt {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for ByRecordedAt {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.recorded_at.cmp(&other.0.recorded_at)
    }
}

/// One record and its audit events as JSON (`{"task": ..., "audit": [...]}`), or `None`.
pub fn task_detail(
    store: &dyn TaskStore,
    upstream: &str,
    task_id: &str,
) -> Result<Option<serde_json::Value>, String> {
    let Some(record) = store.get(upstream, task_id).map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    let audit = store
        .audit_for(upstream, task_id)
        .map_err(|e| e.to_string())?;
    Ok(Some(serde_json::json!({ "task": record, "audit": audit })))
}

fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::testing::record;
    use crate::store::SledStore;

    #[test]
    fn readyz_parameters() {
        let need = |q: &str| Readiness::of_query(q).map(|r| (r.store, r.upstreams));
        assert_eq!(need(""), Ok((StoreNeed::Required, UpstreamNeed::All)));
        assert_eq!(
            need("store=required"),
            Ok((StoreNeed::Required, UpstreamNeed::All))
        );
        assert_eq!(
            need("store=optional"),
            Ok((StoreNeed::Optional, UpstreamNeed::All))
        );
        assert_eq!(
            need("upstreams=any"),
            Ok((StoreNeed::Required, UpstreamNeed::Any))
        );
        assert_eq!(
            need("store=optional&upstreams=any"),
            Ok((StoreNeed::Optional, UpstreamNeed::Any))
        );
        assert!(need("store=maybe").unwrap_err().contains("maybe"));
        assert!(need("upstreams=most").unwrap_err().contains("most"));
        assert!(need("verbose=1").unwrap_err().contains("verbose"));
    }

    /// Records t0..t9 (t9 newest); odd ones owned by another session, t8 completed.
    async fn store() -> (Arc<SledStore>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(dir.path(), 1 << 20, None).unwrap();
        for i in 0..10u64 {
            let mut r = record(&format!("t{i}"));
            r.recorded_at = 1_000 + i;
            if i % 2 == 1 {
                r.owner = Owner::Session("other".into());
            }
            if i == 8 {
                r.status = TaskStatus::Completed;
            }
            store.create(r).await.unwrap();
        }
        (store, dir)
    }

    fn ids(v: Vec<TaskRecord>) -> Vec<String> {
        v.into_iter().map(|r| r.task_id).collect()
    }

    #[tokio::test]
    async fn owner_and_upstream_page_the_owner_index_newest_first() {
        let (store, _dir) = store().await;
        let mut f = TaskFilter {
            owner: Some("session:s1".into()),
            upstream: Some("up".into()),
            limit: 3,
            ..Default::default()
        };
        assert_eq!(ids(f.collect(&*store).unwrap()), ["t8", "t6", "t4"]);
        f.status = Some(TaskStatus::Working);
        f.limit = 10;
        assert_eq!(ids(f.collect(&*store).unwrap()), ["t6", "t4", "t2", "t0"]);
    }

    #[tokio::test]
    async fn a_scan_keeps_only_the_newest_limit_matches_in_order() {
        let (store, _dir) = store().await;
        let f = TaskFilter {
            limit: 4,
            ..Default::default()
        };
        assert_eq!(ids(f.collect(&*store).unwrap()), ["t9", "t8", "t7", "t6"]);
        let f = TaskFilter {
            owner: Some("session:other".into()),
            limit: 2,
            ..Default::default()
        };
        assert_eq!(ids(f.collect(&*store).unwrap()), ["t9", "t7"]);
    }

    /// tester4 finding 1: a task store failed for good (sled after an I/O error) makes
    /// `/healthz` and `/readyz` answer 503 naming the failure and "restart taskgate" (they said
    /// 200 and `"store":"ok"` while every store write hung), and `taskgate_store_failed` 1.
    #[tokio::test]
    async fn a_failed_store_fails_healthz_and_readyz_and_sets_the_gauge() {
        let (store, _dir) = store().await;
        let metrics = Arc::new(Metrics::new(&[]));
        let admin = Admin::new(metrics.clone(), Vec::new(), store.clone());
        let body = |r: Response<Body>| async move {
            let status = r.status();
            let bytes = http_body_util::BodyExt::collect(r.into_body())
                .await
                .unwrap()
                .to_bytes();
            (
                status,
                serde_json::from_slice::<serde_json::Value>(&bytes).unwrap(),
            )
        };
        let required = Readiness::of_query("").unwrap();
        assert_eq!(body(admin.healthz()).await.0, StatusCode::OK);
        assert_eq!(body(admin.readyz(required).await).await.0, StatusCode::OK);

        store.fail_for_test("IO error: No space left on device (os error 28)");
        let (status, health) = body(admin.healthz()).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        let named = health["store"].as_str().unwrap();
        assert!(
            named.contains("No space left on device") && named.contains("restart taskgate"),
            "{health}"
        );
        let (status, ready) = body(admin.readyz(required).await).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(ready["store"], health["store"], "{ready}");
        assert_eq!(ready["ready"], false);
        let text = String::from_utf8(admin.metrics_text()).unwrap();
        assert!(text.contains("\ntaskgate_store_failed 1\n"), "{text}");
        assert_eq!(metrics.store_failed.get(), 1);
    }
}
