//! Helpers for the layer unit tests: a [`TaskStore`] that counts what reaches it, a registry over
//! it, and requests and records built by hand.

use crate::config::TasksConfig;
use crate::exchange::{McpReply, McpRequest, Operation, Principal, RequestContext, RequestParts};
use crate::jsonrpc::Message;
use crate::mcp::task::{now_ms, TaskStatus};
use crate::metrics::Metrics;
use crate::registry::Registry;
use crate::store::{
    AuditEvent, ListCursor, Origin, Owner, SledStore, SlotStore, StoreError, TaskRecord, TaskStore,
};
use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{HeaderMap, HeaderValue};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Store calls counted by [`CountingStore`].
#[derive(Default, Debug)]
pub struct Counts {
    pub gets: AtomicUsize,
    pub updates: AtomicUsize,
    pub creates: AtomicUsize,
    pub audits: AtomicUsize,
    pub scans: AtomicUsize,
    /// Waited syncs (`TaskStore::sync`: something must be durable before a message leaves).
    pub syncs: AtomicUsize,
}

impl Counts {
    /// `[gets, updates, creates, audits, scans]`.
    pub fn snapshot(&self) -> [usize; 5] {
        [
            self.gets.load(Ordering::SeqCst),
            self.updates.load(Ordering::SeqCst),
            self.creates.load(Ordering::SeqCst),
            self.audits.load(Ordering::SeqCst),
            self.scans.load(Ordering::SeqCst),
        ]
    }
    pub fn reset(&self) {
        for c in [
            &self.gets,
            &self.updates,
            &self.creates,
            &self.audits,
            &self.scans,
            &self.syncs,
        ] {
            c.store(0, Ordering::SeqCst);
        }
    }
}

/// A sled store (in a temporary directory) that counts the calls that reach it.
pub struct CountingStore {
    inner: Arc<SledStore>,
    pub counts: Arc<Counts>,
    /// When set, every `create` fails (`StoreError::Db`), as a database that went away would.
    pub fail_creates: std::sync::atomic::AtomicBool,
    /// When set, every `list_owner` fails (`StoreError::Db` with a driver's kind of text), as
    /// a database that went away would.
    pub fail_lists: std::sync::atomic::AtomicBool,
    /// When set, every read and write of a held session fails (`StoreError::Db`).
    pub fail_held: std::sync::atomic::AtomicBool,
    /// When set, every `update` and `update_from` fails (`StoreError::Db`), as a database that
    /// went away would.
    pub fail_updates: std::sync::atomic::AtomicBool,
    /// When set, every `get` fails (`StoreError::Db`), as a database that went away would.
    pub fail_gets: std::sync::atomic::AtomicBool,
    /// Every `remove_held_session` counts itself in `held_removals_begun`, then takes this
    /// lock: a test holding it keeps removals waiting (a slow store).
    pub held_removals: std::sync::Mutex<()>,
    pub held_removals_begun: AtomicUsize,
    /// Every `sync` takes this lock first: a test holding it keeps group commits waiting.
    pub syncs_gate: tokio::sync::Mutex<()>,
    /// When set, the store is a shared one ([`TaskStore::slots`]: [`FakeSlots`]).
    pub with_slots: std::sync::atomic::AtomicBool,
    pub slots: FakeSlots,
    /// Every record as an `update` or `update_from` left it (what a crash right after that
    /// write could leave on disk).
    pub written: std::sync::Mutex<Vec<TaskRecord>>,
    _dir: tempfile::TempDir,
}

/// The live-task slots of a shared store as [`CountingStore`] fakes them: every
/// `reserve_slot` counts itself in `begun`, then takes the `gate` lock (a test holding it keeps
/// the takings waiting, as a database that answers late) and hands out the next id, whatever
/// the limit; the ids given back are noted.
#[derive(Default)]
pub struct FakeSlots {
    pub begun: AtomicUsize,
    pub gate: std::sync::Mutex<()>,
    next: AtomicUsize,
    pub released: std::sync::Mutex<Vec<i64>>,
    /// When set, every `reserve_slot` fails (`StoreError::Db`), as a database that went away
    /// would.
    pub fail: std::sync::atomic::AtomicBool,
}

impl CountingStore {
    fn note_written(&self, updated: &Result<Option<(TaskRecord, TaskRecord)>, StoreError>) {
        if let Ok(Some((before, after))) = updated {
            if before != after {
                self.written.lock().unwrap().push(after.clone());
            }
        }
    }

    pub fn new() -> Arc<CountingStore> {
        let dir = tempfile::tempdir().unwrap();
        let inner = SledStore::open(dir.path(), 1 << 20, None).unwrap();
        Arc::new(CountingStore {
            inner,
            counts: Arc::default(),
            fail_creates: Default::default(),
            fail_lists: Default::default(),
            fail_held: Default::default(),
            fail_updates: Default::default(),
            fail_gets: Default::default(),
            held_removals: Default::default(),
            held_removals_begun: Default::default(),
            syncs_gate: Default::default(),
            with_slots: Default::default(),
            slots: FakeSlots::default(),
            written: Default::default(),
            _dir: dir,
        })
    }
}

fn inc(c: &AtomicUsize) {
    c.fetch_add(1, Ordering::SeqCst);
}

impl CountingStore {
    /// Fails the sled store for good, as an I/O error does (`sled_store::failure`).
    pub fn fail_for_good(&self, why: &str) {
        self.inner.fail_for_test(why);
    }
}

impl TaskStore for CountingStore {
    fn failed(&self) -> Option<String> {
        self.inner.failed()
    }
    fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        self.inner.ping()
    }
    fn quick_point_calls(&self) -> bool {
        !self.with_slots.load(Ordering::SeqCst) && self.inner.quick_point_calls()
    }
    fn shared(&self) -> bool {
        self.with_slots.load(Ordering::SeqCst)
    }
    fn create(&self, record: TaskRecord) -> BoxFuture<'_, Result<(), StoreError>> {
        inc(&self.counts.creates);
        if self.fail_creates.load(Ordering::SeqCst) {
            return Box::pin(async { Err(StoreError::Db("the store is down (test)".into())) });
        }
        self.inner.create(record)
    }
    fn get(&self, upstream: &str, task_id: &str) -> Result<Option<TaskRecord>, StoreError> {
        inc(&self.counts.gets);
        if self.fail_gets.load(Ordering::SeqCst) {
            return Err(StoreError::Db("the store is down (test)".into()));
        }
        self.inner.get(upstream, task_id)
    }
    fn update(
        &self,
        upstream: &str,
        task_id: &str,
        change: &mut dyn FnMut(&mut TaskRecord) -> bool,
    ) -> Result<Option<(TaskRecord, TaskRecord)>, StoreError> {
        inc(&self.counts.updates);
        if self.fail_updates.load(Ordering::SeqCst) {
            return Err(StoreError::Db("the store is down (test)".into()));
        }
        let updated = self.inner.update(upstream, task_id, change);
        self.note_written(&updated);
        updated
    }
    fn update_from(
        &self,
        upstream: &str,
        task_id: &str,
        known: &TaskRecord,
        change: &mut dyn FnMut(&mut TaskRecord) -> bool,
    ) -> Result<Option<(TaskRecord, TaskRecord)>, StoreError> {
        inc(&self.counts.updates);
        if self.fail_updates.load(Ordering::SeqCst) {
            return Err(StoreError::Db("the store is down (test)".into()));
        }
        let updated = self.inner.update_from(upstream, task_id, known, change);
        self.note_written(&updated);
        updated
    }
    fn remove(&self, upstream: &str, task_id: &str) -> Result<Option<TaskRecord>, StoreError> {
        self.inner.remove(upstream, task_id)
    }
    fn list_owner(
        &self,
        upstream: &str,
        owner: &Owner,
        cursor: Option<&ListCursor>,
        limit: usize,
    ) -> Result<(Vec<TaskRecord>, Option<ListCursor>), StoreError> {
        if self.fail_lists.load(Ordering::SeqCst) {
            return Err(StoreError::Db(
                "postgres: error connecting to server at db.internal:5432 (test)".into(),
            ));
        }
        self.inner.list_owner(upstream, owner, cursor, limit)
    }
    fn cursor_is_valid(&self, upstream: &str, owner: &Owner, cursor: &ListCursor) -> bool {
        self.inner.cursor_is_valid(upstream, owner, cursor)
    }
    fn expired(&self, now_ms: u64, limit: usize) -> Result<Vec<(String, String)>, StoreError> {
        self.inner.expired(now_ms, limit)
    }
    fn scan(&self, visit: &mut dyn FnMut(TaskRecord) -> bool) -> Result<(), StoreError> {
        inc(&self.counts.scans);
        self.inner.scan(visit)
    }
    fn append_audit(&self, event: &AuditEvent) -> Result<(), StoreError> {
        inc(&self.counts.audits);
        self.inner.append_audit(event)
    }
    fn audit_for(&self, upstream: &str, task_id: &str) -> Result<Vec<AuditEvent>, StoreError> {
        self.inner.audit_for(upstream, task_id)
    }
    fn sync(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        inc(&self.counts.syncs);
        Box::pin(async move {
            let _gate = self.syncs_gate.lock().await;
            self.inner.sync().await
        })
    }
    fn sync_soon(&self) {
        self.inner.sync_soon()
    }
    fn slots(&self) -> Option<&dyn SlotStore> {
        self.with_slots
            .load(Ordering::SeqCst)
            .then_some(self as &dyn SlotStore)
    }
}

impl SlotStore for CountingStore {
    fn reserve_slot(
        &self,
        _upstream: &str,
        _owner: &Owner,
        _limit: usize,
        _lease: std::time::Duration,
    ) -> Result<Option<i64>, StoreError> {
        inc(&self.slots.begun);
        let _wait = self.slots.gate.lock();
        if self.slots.fail.load(Ordering::SeqCst) {
            return Err(StoreError::Db(
                "postgres: error connecting to server at db.internal:5432 (test)".into(),
            ));
        }
        Ok(Some(
            self.slots.next.fetch_add(1, Ordering::SeqCst) as i64 + 1,
        ))
    }
    fn release_slot(&self, slot: i64) {
        if let Ok(mut released) = self.slots.released.lock() {
            released.push(slot);
        }
    }
    fn create_in_slot(
        &self,
        record: TaskRecord,
        _slot: i64,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        self.create(record)
    }
    fn count_by_status(&self) -> Result<crate::store::StatusCounts, StoreError> {
        Ok(Default::default())
    }
}

impl crate::store::HeldSessionStore for CountingStore {
    fn put_held_session(&self, session: crate::store::HeldSessionRecord) -> Result<(), StoreError> {
        if self.fail_held.load(Ordering::SeqCst) {
            return Err(StoreError::Db("the store is down (test)".into()));
        }
        self.inner.put_held_session(session)
    }
    fn held_session(
        &self,
        upstream: &str,
        session_id: &str,
    ) -> Result<Option<crate::store::HeldSessionRecord>, StoreError> {
        if self.fail_held.load(Ordering::SeqCst) {
            return Err(StoreError::Db("the store is down (test)".into()));
        }
        self.inner.held_session(upstream, session_id)
    }
    fn touch_held_session(&self, upstream: &str, id: &str, at: u64) -> Result<bool, StoreError> {
        self.inner.touch_held_session(upstream, id, at)
    }
    fn remove_held_session(&self, upstream: &str, id: &str) -> Result<bool, StoreError> {
        inc(&self.held_removals_begun);
        let _wait = self.held_removals.lock();
        self.inner.remove_held_session(upstream, id)
    }
    fn remove_expired_held_sessions(&self, now: u64, limit: usize) -> Result<usize, StoreError> {
        self.inner.remove_expired_held_sessions(now, limit)
    }
}

/// A registry over a fresh counting store, with the counts.
pub fn registry() -> (Arc<Registry>, Arc<CountingStore>) {
    registry_with(TasksConfig::default())
}

/// [`registry`] with `config`.
pub fn registry_with(config: TasksConfig) -> (Arc<Registry>, Arc<CountingStore>) {
    let store = CountingStore::new();
    let metrics = Arc::new(Metrics::new(&["up".to_string()]));
    let registry = Registry::new(store.clone() as Arc<dyn TaskStore>, metrics, config).unwrap();
    (registry, store)
}

/// The owner of [`request`]'s caller.
pub fn owner() -> Owner {
    Owner::Session("s1".into())
}

/// A working task `task_id` on upstream `up` owned by [`owner`].
pub fn record(task_id: &str) -> TaskRecord {
    let now = now_ms();
    TaskRecord {
        upstream: "up".into(),
        task_id: task_id.into(),
        owner: owner(),
        upstream_session: Some("s1".into()),
        origin: Origin::Client,
        tool: Some("slow".into()),
        protocol_version: None,
        status: TaskStatus::Working,
        status_message: None,
        created_at: "2026-01-01T00:00:00Z".into(),
        last_updated_at: "2026-01-01T00:00:00Z".into(),
        ttl_ms: Some(60_000),
        poll_interval_ms: None,
        recorded_at: now,
        cancel_requested_at: None,
        cancelled_at: None,
        released_at: None,
        terminal_at: None,
        late_result_at: None,
        tool_error: false,
        era: crate::mcp::era::Era::Legacy,
        terminal_result: None,
        terminal_error: None,
        input_requests: None,
        cancel_acked: false,
        trace_parent: None,
        expires_at: now + 60_000,
    }
}

/// A POSTed JSON-RPC message from the caller with session `s1` on upstream `up`.
pub fn request(json: &str) -> McpRequest {
    let session = HeaderValue::from_static("s1");
    McpRequest::from(RequestParts {
        op: Operation::Post(Message::parse(Bytes::from(json.to_string())).unwrap()),
        ctx: RequestContext {
            upstream: "up".into(),
            session_id: Some(session.clone()),
            client_session_id: Some(session),
            principal: Principal::Anonymous,
            client_addr: None,
            headers: HeaderMap::new(),
        },
        extensions: http::Extensions::new(),
        trace: None,
    })
}

/// The bytes of a JSON reply.
pub fn json_of(reply: &McpReply) -> serde_json::Value {
    match &reply.body {
        crate::exchange::ReplyBody::Json(b) => serde_json::from_slice(b).unwrap(),
        other => panic!("not a JSON reply: {other:?}"),
    }
}

/// A scripted upstream for the session-stage tests: `initialize` answered with session
/// `issued-<n>` (declaring `tasks.requests.tools.call`), anything else with a `tools/list`
/// result naming one `required` tool `t`.
pub fn issuing_upstream() -> impl tower::Service<
    McpRequest,
    Response = McpReply,
    Error = crate::exchange::GatewayError,
    Future = impl Send,
> + Clone
       + Send {
    let n = Arc::new(std::sync::atomic::AtomicU64::new(0));
    tower::service_fn(move |req: McpRequest| {
        let n = n.clone();
        async move {
            let id = req
                .id()
                .map(|i| i.as_json().to_string())
                .unwrap_or("null".into());
            let mut reply = if req.request_method() == Some("initialize") {
                let body = format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"result":{{"capabilities":{{"tasks":{{"requests":{{"tools":{{"call":{{}}}}}}}}}}}}}}"#
                );
                let mut r = McpReply::local_json(Bytes::from(body));
                let k = n.fetch_add(1, Ordering::SeqCst);
                r.headers.insert(
                    "mcp-session-id",
                    HeaderValue::from_str(&format!("issued-{k}")).unwrap(),
                );
                r
            } else {
                McpReply::local_json(Bytes::from(format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"result":{{"tools":[{{"name":"t","execution":{{"taskSupport":"required"}}}}]}}}}"#
                )))
            };
            reply.status = http::StatusCode::OK;
            Ok::<_, crate::exchange::GatewayError>(reply)
        }
    })
}
