//! What a child's messages are routed by: the ids taskgate writes to it, and what names one of
//! its callers (progress tokens, task ids, the child's own requests).
//!
//! One child may carry many clients (`process = "shared"`). The id of every request taskgate
//! writes is its own: a number from a counter per child, never the client's. The child's answer
//! names that number; the table gives back the caller (its session and its own id, of its
//! exact JSON type). A `notifications/cancelled` from a client names its own id: the table
//! gives the number the child saw. A client's `progressToken` is replaced by the request's
//! number too, so two clients' equal tokens never meet in the child.
//!
//! Bounds: requests in flight are bounded by the upstream's `max_in_flight` (a permit each);
//! the notes about tokens, tasks and the child's own requests hold at most [`MAX_NOTES`]
//! entries each; a full table forgets its oldest note to take a new one (that route is lost:
//! a late progress or status notification for it is dropped and counted, never sent to the
//! wrong client; the others, the live tasks of every client among them, stay). The task table
//! forgets the tasks the child reported ended first (a terminal status in a status
//! notification or an answer, [`Routes::task_ended`]), oldest first, and only then its oldest
//! live one: an ended task's route serves only late messages about it, a live one's its
//! status notifications and the child's requests for its client.

use crate::jsonrpc::Id;
use crate::mcp::capabilities::ClientCapabilities;
use bytes::Bytes;
use std::borrow::Borrow;
use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, OwnedSemaphorePermit};

/// Entries at most in each table of notes.
pub const MAX_NOTES: usize = 65_536;

/// The session a caller's messages belong to (`None`: a request without a session, 2026-07-28).
pub type SessionKey = Option<Arc<str>>;

/// The end of a request: the child's answer (its id already the caller's), or why none came.
pub type Answer = Result<Bytes, String>;

/// A request written to the child, waiting for its answer.
pub struct Pending {
    /// The caller's own id, of its exact JSON type.
    pub client_id: Id,
    /// The caller's session.
    pub session: SessionKey,
    /// Where the answer goes.
    pub answer: oneshot::Sender<Answer>,
    /// Where messages related to the request go before its answer (bounded; a full channel
    /// drops the message, counted).
    pub related: super::queue::QueueTx<Bytes>,
    /// A task-augmented call: its answer names a task whose later messages go to `session`.
    pub task_call: bool,
    /// Its in-flight slot (`max_in_flight`), freed with the entry.
    pub permit: Option<OwnedSemaphorePermit>,
    /// The child was told it is cancelled (the caller's `notifications/cancelled` went to it):
    /// it is not told again when the request is given up or dropped.
    pub told: bool,
    /// Its line is in the child's stdin queue: a cancellation of it is written after it (see
    /// [`Pending::held_cancel`]), and its caller's drop tells the child (one never queued is
    /// forgotten: the child never saw it).
    pub queued: bool,
    /// The caller's `notifications/cancelled` (as the child is to read it), while the request
    /// still waits for room in the stdin queue: written once the request is (after it), never
    /// when the request is not (the child would read an id it never saw).
    pub held_cancel: Option<Bytes>,
    /// An `initialize`, or taskgate's own request (its era probe, its `initialize`): no client
    /// has a session to answer a request of the child's tied to it on (see `conn`).
    pub before_session: bool,
    /// The gateway task it is the held call of (`exchange::HeldTask`): named in the child's
    /// death when it is still in flight then.
    pub held_task: Option<Arc<str>>,
    /// Whether its line is written or withdrawn (see [`Claim`]).
    pub claim: Arc<Claim>,
    /// What its client declared in its `initialize` (`sampling`, `elicitation`, `roots`): a
    /// request of the child's needing a capability it lacks is never sent to it.
    pub declared: ClientCapabilities,
}

/// Who decides first about a registered request's line: the writer (it writes it; a give-up
/// or drop then tells the child `notifications/cancelled`), or its caller's end (its deadline
/// passed, or it went away: the line is skipped, and the child, never seeing it, is told
/// nothing). Decided once, atomically, so a request is either run and cancelled, or neither.
#[derive(Debug, Default)]
pub struct Claim(AtomicU8);

impl Claim {
    const QUEUED: u8 = 0;
    const WRITTEN: u8 = 1;
    const WITHDRAWN: u8 = 2;

    /// The writer takes it: true when the line is to be written (not withdrawn first).
    pub fn write(&self) -> bool {
        self.0
            .compare_exchange(
                Self::QUEUED,
                Self::WRITTEN,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
    }

    /// Its caller's end: true when the line was never written (and now never will be).
    pub fn withdraw(&self) -> bool {
        match self.0.compare_exchange(
            Self::QUEUED,
            Self::WITHDRAWN,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => true,
            Err(now) => now == Self::WITHDRAWN,
        }
    }

    /// Whether its caller's end came first.
    pub fn withdrawn(&self) -> bool {
        self.0.load(Ordering::Acquire) == Self::WITHDRAWN
    }
}

/// A replaced `progressToken`: whose it is and what it was.
#[derive(Debug, Clone)]
pub struct Progress {
    /// The caller's session.
    pub session: SessionKey,
    /// The caller's token, as JSON text.
    pub original: String,
}

/// What taskgate saw of a task the child created: whose it is, and the `Task` fields a
/// stand-in answer needs once the child is gone (`createdAt`, `ttl`, as JSON text).
#[derive(Debug, Clone, Default)]
pub struct TaskNote {
    /// The session whose request created it.
    pub session: SessionKey,
    /// Its `createdAt` (JSON text), when the child gave one.
    pub created_at: Option<String>,
    /// Its `ttl` (JSON text), when the child gave one.
    pub ttl: Option<String>,
    /// What the client of the request that created it declared ([`Pending::declared`]).
    pub declared: ClientCapabilities,
    /// When taskgate noted it (set by [`Routes::note_task`]): its ttl runs from then, on
    /// taskgate's clock.
    pub noted_at: Option<Instant>,
}

/// Whom a request of the child's without a related task goes to, among the requests in flight
/// ([`Routes::asked_of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Candidates {
    /// The one request in flight is an `initialize` (or taskgate's own request): no client
    /// has a session to answer on yet.
    BeforeSession,
    /// No request in flight whose client could still answer (none, or each one cancelled).
    NoRequest,
    /// Requests in flight, but no client of theirs declared the capability it needs.
    NoneDeclared,
    /// Exactly one request in flight whose client declared it: this one.
    One(u64),
    /// Several: taskgate cannot tell which client it is for.
    Several,
}

impl TaskNote {
    /// Whether the task may still be live at `now`: noted, and its ttl (milliseconds; no ttl,
    /// or `null`, counts as [`UNBOUNDED_TTL`]) not over since.
    fn within_ttl(&self, now: Instant) -> bool {
        let ttl = self
            .ttl
            .as_deref()
            .and_then(|t| t.trim().parse::<f64>().ok())
            .filter(|ms| ms.is_finite() && *ms >= 0.0)
            .map_or(UNBOUNDED_TTL, |ms| {
                Duration::from_millis(ms.min(u64::MAX as f64) as u64)
            });
        self.noted_at
            .is_some_and(|at| now.saturating_duration_since(at) < ttl)
    }
}

/// How long a task the child gave no ttl (or `null`) is taken to live: the default of
/// `tasks.max_ttl_ms` (24 h), which taskgate's own record of it expires at.
pub const UNBOUNDED_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// The routing tables of one child.
#[derive(Default)]
pub struct Routes {
    next: u64,
    pending: HashMap<u64, Pending>,
    by_client: HashMap<(SessionKey, Id), u64>,
    progress: Notes<u64, Progress>,
    tasks: Notes<String, TaskNote>,
    asked: Notes<String, SessionKey>,
}

impl Routes {
    /// Takes the next id for `p` and keeps it until its answer. Returns the id the child sees.
    pub fn insert(&mut self, p: Pending) -> u64 {
        // Starts at 1: 0 is written by nobody (a child that answers 0 answers no one).
        self.next += 1;
        let out = self.next;
        self.by_client
            .insert((p.session.clone(), p.client_id.clone()), out);
        self.pending.insert(out, p);
        out
    }

    /// The id the child saw for the caller's request `id` in `session`, while it is in flight.
    pub fn out_id(&self, session: &SessionKey, id: &Id) -> Option<u64> {
        self.by_client.get(&(session.clone(), id.clone())).copied()
    }

    /// The request the child knows as `out`, removed (its answer came, or it is given up).
    pub fn take(&mut self, out: u64) -> Option<Pending> {
        let p = self.pending.remove(&out)?;
        let key = (p.session.clone(), p.client_id.clone());
        if self.by_client.get(&key) == Some(&out) {
            self.by_client.remove(&key);
        }
        // A progress token lives with its request, or with its task (noted on the answer).
        if !p.task_call {
            self.progress.remove(&out);
        }
        Some(p)
    }

    /// The request the child knows as `out`, while it waits.
    pub fn get(&self, out: u64) -> Option<&Pending> {
        self.pending.get(&out)
    }

    /// The request the child knows as `out`, to change.
    pub fn get_mut(&mut self, out: u64) -> Option<&mut Pending> {
        self.pending.get_mut(&out)
    }

    /// The id the child saw for `session`'s request `id`, marked told (see [`Pending::told`]);
    /// `None` when it is not in flight or was told already (one cancellation per request).
    pub fn tell_cancelled(&mut self, session: &SessionKey, id: &Id) -> Option<u64> {
        let out = self.out_id(session, id)?;
        let p = self.pending.get_mut(&out)?;
        if std::mem::replace(&mut p.told, true) {
            return None;
        }
        Some(out)
    }

    /// Every request still waiting (the child is gone), removed.
    pub fn drain(&mut self) -> Vec<Pending> {
        self.by_client.clear();
        self.pending.drain().map(|(_, p)| p).collect()
    }

    /// Requests waiting now.
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// The request in flight a request of the child's is for, when it names no task: the one
    /// request whose client declared what it needs (`declares`), the requests whose child was
    /// told they are cancelled left out (their callers take no more input). Tester 3 F5: with
    /// another client's call in flight it was refused, whatever that client declared.
    pub fn asked_of(&self, declares: impl Fn(ClientCapabilities) -> bool) -> Candidates {
        let mut all = self.pending.iter();
        if let (Some((_, p)), None) = (all.next(), all.next()) {
            if p.before_session {
                return Candidates::BeforeSession;
            }
        }
        let mut live = self
            .pending
            .iter()
            .filter(|(_, p)| !p.before_session && !p.told)
            .peekable();
        if live.peek().is_none() {
            return Candidates::NoRequest;
        }
        let mut able = live
            .filter(|(_, p)| declares(p.declared))
            .map(|(&out, _)| out);
        match (able.next(), able.next()) {
            (None, _) => Candidates::NoneDeclared,
            (Some(out), None) => Candidates::One(out),
            (Some(_), Some(_)) => Candidates::Several,
        }
    }

    /// Notes that request `out` carried the caller's token `original` (replaced by `out`).
    pub fn note_progress(&mut self, out: u64, progress: Progress) {
        self.progress.insert(out, progress);
    }

    /// Whose token `token` (a number taskgate wrote) is.
    pub fn progress(&self, token: u64) -> Option<&Progress> {
        self.progress.get(&token)
    }

    /// Notes that task `task_id` was created by a request of `note.session` (now, unless
    /// `note.noted_at` says when).
    pub fn note_task(&mut self, task_id: String, mut note: TaskNote) {
        note.noted_at.get_or_insert_with(Instant::now);
        self.tasks.insert(task_id, note);
    }

    /// Whether a task the child created is live at `now`: noted, not reported ended (a
    /// terminal status in a status notification or an answer), and within its ttl.
    pub fn has_live_task(&self, now: Instant) -> bool {
        self.tasks.live().any(|note| note.within_ttl(now))
    }

    /// Notes that task `task_id` ended (the child reported a terminal status): a full table
    /// forgets it before any live task. Nothing when it is not noted.
    pub fn task_ended(&mut self, task_id: &str) {
        self.tasks.mark_ended(task_id);
    }

    /// The session that created task `task_id`, if noted.
    pub fn task_session(&self, task_id: &str) -> Option<&SessionKey> {
        self.tasks.get(task_id).map(|n| &n.session)
    }

    /// What taskgate noted of task `task_id`.
    pub fn task_note(&self, task_id: &str) -> Option<&TaskNote> {
        self.tasks.get(task_id)
    }

    /// Every task noted, removed (the child is gone, and its tasks with it).
    pub fn drain_tasks(&mut self) -> Vec<(String, TaskNote)> {
        self.tasks.drain()
    }

    /// Notes that the child's request `id` (JSON text) was sent to `session`.
    pub fn note_asked(&mut self, id: String, session: SessionKey) {
        self.asked.insert(id, session);
    }

    /// The session the child's request `id` (JSON text) went to, removed once answered.
    pub fn take_asked(&mut self, id: &str) -> Option<SessionKey> {
        self.asked.remove(id)
    }

    /// The session the child's request `id` went to (it stays noted).
    pub fn asked(&self, id: &str) -> Option<&SessionKey> {
        self.asked.get(id)
    }
}

/// A table of notes, at most [`MAX_NOTES`]: a full one forgets a note to take a new one, its
/// oldest note marked ended ([`Notes::mark_ended`]) if there is one, else its oldest (the one
/// noted or noted again longest ago).
pub struct Notes<K, V> {
    map: HashMap<K, (u64, V)>,
    /// The keys by when they were noted.
    order: BTreeMap<u64, K>,
    /// The keys marked ended by when they were noted (a subset of `order`).
    ended: BTreeMap<u64, K>,
    next: u64,
}

impl<K, V> Default for Notes<K, V> {
    fn default() -> Self {
        Notes {
            map: HashMap::new(),
            order: BTreeMap::new(),
            ended: BTreeMap::new(),
            next: 0,
        }
    }
}

impl<K: Hash + Eq + Clone, V> Notes<K, V> {
    /// Notes `v` under `k` (the newest note; the oldest goes when the table is full).
    pub fn insert(&mut self, k: K, v: V) {
        if let Some((seq, _)) = self.map.remove(&k) {
            self.order.remove(&seq);
            self.ended.remove(&seq);
        }
        while self.map.len() >= MAX_NOTES {
            let Some((seq, oldest)) = self.ended.pop_first().or_else(|| self.order.pop_first())
            else {
                break;
            };
            self.order.remove(&seq);
            self.map.remove(&oldest);
        }
        self.next += 1;
        self.order.insert(self.next, k.clone());
        self.map.insert(k, (self.next, v));
    }

    /// The note under `k`.
    pub fn get<Q: Hash + Eq + ?Sized>(&self, k: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
    {
        self.map.get(k).map(|(_, v)| v)
    }

    /// Marks the note under `k` ended: a full table forgets it before the notes not marked.
    pub fn mark_ended<Q: Hash + Eq + ?Sized>(&mut self, k: &Q)
    where
        K: Borrow<Q>,
    {
        let Some(seq) = self.map.get(k).map(|(seq, _)| *seq) else {
            return;
        };
        if let Some(key) = self.order.get(&seq) {
            self.ended.insert(seq, key.clone());
        }
    }

    /// The note under `k`, removed.
    pub fn remove<Q: Hash + Eq + ?Sized>(&mut self, k: &Q) -> Option<V>
    where
        K: Borrow<Q>,
    {
        let (seq, v) = self.map.remove(k)?;
        self.order.remove(&seq);
        self.ended.remove(&seq);
        Some(v)
    }

    /// The notes not marked ended.
    pub fn live(&self) -> impl Iterator<Item = &V> {
        self.map
            .values()
            .filter(|(seq, _)| !self.ended.contains_key(seq))
            .map(|(_, v)| v)
    }

    /// Every note, removed.
    pub fn drain(&mut self) -> Vec<(K, V)> {
        self.order.clear();
        self.ended.clear();
        self.map.drain().map(|(k, (_, v))| (k, v)).collect()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(session: &str, id: &str) -> (Pending, oneshot::Receiver<Answer>) {
        let (tx, rx) = oneshot::channel();
        let (related, _) = super::super::queue::queue(1, 1024);
        (
            Pending {
                client_id: Id::from_json(id).expect("valid id"),
                session: Some(session.into()),
                answer: tx,
                related,
                task_call: false,
                permit: None,
                told: false,
                queued: false,
                held_cancel: None,
                before_session: false,
                held_task: None,
                claim: Arc::default(),
                declared: ClientCapabilities::default(),
            },
            rx,
        )
    }

    #[test]
    fn two_callers_with_the_same_id_get_two_ids() {
        let mut routes = Routes::default();
        let (a, _ra) = pending("s1", "1");
        let (b, _rb) = pending("s2", "1");
        let (na, nb) = (routes.insert(a), routes.insert(b));
        assert_ne!(na, nb);
        let one = Id::from_json("1").expect("id");
        assert_eq!(routes.out_id(&Some("s1".into()), &one), Some(na));
        assert_eq!(routes.out_id(&Some("s2".into()), &one), Some(nb));
        // The JSON type is kept: "1" is not 1.
        let text = Id::from_json("\"1\"").expect("id");
        assert_eq!(routes.out_id(&Some("s1".into()), &text), None);
        let got = routes.take(nb).expect("pending");
        assert_eq!(got.session.as_deref(), Some("s2"));
        assert_eq!(routes.out_id(&Some("s2".into()), &one), None);
        assert_eq!(routes.asked_of(|_| true), Candidates::One(na));
        assert_eq!(routes.drain().len(), 1);
        assert_eq!(routes.in_flight(), 0);
    }

    #[test]
    fn a_progress_token_lives_with_its_request_unless_it_made_a_task() {
        let mut routes = Routes::default();
        let (a, _ra) = pending("s1", "7");
        let out = routes.insert(a);
        routes.note_progress(
            out,
            Progress {
                session: Some("s1".into()),
                original: "\"tok\"".into(),
            },
        );
        assert_eq!(
            routes.progress(out).map(|p| p.original.as_str()),
            Some("\"tok\"")
        );
        routes.take(out);
        assert!(routes.progress(out).is_none());

        let (mut b, _rb) = pending("s1", "8");
        b.task_call = true;
        let out = routes.insert(b);
        routes.note_progress(
            out,
            Progress {
                session: Some("s1".into()),
                original: "1".into(),
            },
        );
        routes.take(out);
        assert!(
            routes.progress(out).is_some(),
            "kept for the task's lifetime"
        );
    }

    /// A full table forgets its oldest note, not every note: it was emptied, and the live tasks
    /// of every client lost their routes (their status notifications and requests dropped).
    #[test]
    fn a_full_table_forgets_its_oldest_note_only() {
        let mut routes = Routes::default();
        for i in 0..=MAX_NOTES {
            routes.note_task(format!("t{i}"), TaskNote::default());
        }
        assert!(routes.tasks.len() <= MAX_NOTES);
        assert!(routes.task_session("t0").is_none(), "the oldest goes");
        assert!(routes.task_session("t1").is_some(), "the others stay");
        assert!(routes.task_session(&format!("t{MAX_NOTES}")).is_some());
        // One taken out of the middle is not counted twice, nor evicted in its place later.
        routes.note_asked("a".into(), None);
        routes.take_asked("a");
        routes.note_asked("b".into(), None);
        for i in 0..MAX_NOTES - 1 {
            routes.note_asked(format!("c{i}"), None);
        }
        assert!(
            routes.asked("b").is_some(),
            "not evicted: the table was not full"
        );
    }

    /// A task is live while the child did not report it ended and its ttl (from when taskgate
    /// noted it; none or `null`: [`UNBOUNDED_TTL`]) is not over (tester 3 F22: what keeps a
    /// `per_session` child).
    #[test]
    fn a_task_is_live_until_reported_ended_or_past_its_ttl() {
        let mut routes = Routes::default();
        let now = Instant::now();
        assert!(!routes.has_live_task(now), "no task");
        let note = |ttl: Option<&str>| TaskNote {
            ttl: ttl.map(str::to_string),
            noted_at: Some(now),
            ..TaskNote::default()
        };
        routes.note_task("short".into(), note(Some("1000")));
        assert!(routes.has_live_task(now));
        assert!(
            !routes.has_live_task(now + Duration::from_millis(1000)),
            "past its ttl"
        );
        routes.note_task("unbounded".into(), note(Some("null")));
        assert!(routes.has_live_task(now + Duration::from_secs(3600)));
        assert!(!routes.has_live_task(now + UNBOUNDED_TTL));
        routes.task_ended("unbounded");
        assert!(
            !routes.has_live_task(now + Duration::from_secs(3600)),
            "reported ended"
        );
        routes.note_task("fresh".into(), TaskNote::default());
        assert!(
            routes.has_live_task(Instant::now()),
            "noted now when no time is given"
        );
    }

    /// A note marked ended goes before the others, oldest first; its mark goes with it when it
    /// is removed or noted again (then it is live, and the newest).
    #[test]
    fn an_ended_note_goes_first() {
        let mut notes: Notes<usize, ()> = Notes::default();
        for i in 0..MAX_NOTES {
            notes.insert(i, ());
        }
        notes.mark_ended(&5);
        notes.remove(&5);
        notes.mark_ended(&7);
        notes.insert(7, ());
        notes.insert(MAX_NOTES, ()); // into the room 5 left
        notes.insert(MAX_NOTES + 1, ()); // full, nothing ended: the oldest goes
        assert!(notes.get(&0).is_none());
        assert!(notes.get(&7).is_some(), "noted again: live");
        notes.mark_ended(&9);
        notes.mark_ended(&8);
        notes.mark_ended(&(MAX_NOTES + 7)); // not noted: nothing
        notes.insert(MAX_NOTES + 2, ());
        assert!(notes.get(&8).is_none(), "the oldest ended note goes");
        assert!(notes.get(&9).is_some() && notes.get(&1).is_some());
        notes.insert(MAX_NOTES + 3, ());
        assert!(notes.get(&9).is_none());
        notes.insert(MAX_NOTES + 4, ());
        assert!(notes.get(&1).is_none(), "then the oldest again");
        assert_eq!(notes.len(), MAX_NOTES);
        assert!(notes.ended.is_empty());
    }

    #[test]
    fn notes_are_bounded() {
        let mut routes = Routes::default();
        for i in 0..(MAX_NOTES + 10) {
            routes.note_task(format!("t{i}"), TaskNote::default());
        }
        assert!(routes.tasks.len() <= MAX_NOTES);
    }
}
