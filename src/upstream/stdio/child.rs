//! One child process: how it is started, how its stderr reaches taskgate's log, and how it is
//! ended.
//!
//! **No orphans.** Each child leads a process group of its own (`setpgid(0, 0)` at spawn), so
//! ending it ends what it started too: close its stdin, wait [`STDIN_GRACE`], `SIGTERM` to the
//! group, wait [`TERM_GRACE`], `SIGKILL` to the group (a deaf child, which reads nothing and so
//! cannot see its stdin close, gets `SIGTERM` at once: [`end_deaf`]). Should taskgate itself die without
//! ending its children (`kill -9`, a crash), the kernel's parent-death signal ends each child:
//! `prctl(PR_SET_PDEATHSIG, SIGKILL)` in the child between fork and exec, checked against a
//! parent that died before the `prctl` (then the child exits at once). The parent-death signal
//! reaches only the process taskgate started, not that process's own children (`bash -c
//! "server; …"`, `npx` → `sh` → `node`, `uv run`), which may run on after a `kill -9` of
//! taskgate (tester 3 F23). So the `taskgate` binary starts each command through itself
//! ([`launch_through`]): `taskgate __stdio-child -- <command…>` ([`super::shim`]) gets the
//! parent-death signal, leads the group, adopts the command's orphans and, when taskgate dies,
//! ends them all (`SIGTERM`, then `SIGKILL` after [`TERM_GRACE`]); otherwise it is
//! transparent (same pipes, the command's exit status, graceful stops as below), and when a
//! stop escalates to `SIGKILL` it ends, on taskgate's word, the command's orphans that left
//! the group too ([`end`]; what can remain: [`super::shim`]). A child whose owning task is
//! dropped before it reaped it gets its whole group killed ([`GroupGuard`]), not only the
//! process taskgate started. Without it
//! (taskgate as a library, its tests), the command is started directly. The signal follows the
//! *thread* that forked, not the process: every child is spawned by a task on the runtime that
//! built the transport (the main thread in `taskgate serve`), never on a serving thread, which
//! ends at shutdown before the children are ended in order.

use crate::config::UpstreamConfig;
use crate::text::cut;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::process::{Child, Command};

/// How long a child may take to exit after its stdin closed before it gets `SIGTERM`.
pub const STDIN_GRACE: Duration = Duration::from_secs(2);
/// How long a child's group may take to exit after `SIGTERM` before it gets `SIGKILL`.
pub const TERM_GRACE: Duration = Duration::from_secs(3);
/// How long the shim may take to end a command's whole tree when taskgate escalates to
/// `SIGKILL` ([`super::shim::ask_to_end_all`]) before its group gets `SIGKILL` from taskgate.
pub const SHIM_END_WAIT: Duration = Duration::from_millis(2500);
/// The longest stderr line logged (longer ones are cut, marked `…`).
pub const STDERR_LINE_BYTES: usize = 4096;
/// stderr lines logged per second per child; past it lines are counted, and the count is
/// logged once the second is over.
pub const STDERR_LINES_PER_SECOND: u32 = 50;

/// The program that starts every child's command as its shim ([`launch_through`]), once set.
static LAUNCHER: OnceLock<PathBuf> = OnceLock::new();

/// Starts every later child through `program` as `program __stdio-child -- <command…>`
/// ([`super::shim`]): `taskgate serve` passes `/proc/self/exe` (itself, even if its file was
/// replaced since). The first call wins; without one, commands are started directly.
pub fn launch_through(program: PathBuf) {
    let _ = LAUNCHER.set(program);
}

/// What starts a child: the `[[upstream]]`'s `command`, `env` and `cwd`.
#[derive(Debug, Clone)]
pub struct Spec {
    /// The upstream's name (in logs).
    pub name: Arc<str>,
    /// The program (a path, or a name looked up on `PATH` by the OS at spawn).
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Added to the child's environment (already expanded).
    pub env: Vec<(String, String)>,
    /// Its working directory.
    pub cwd: Option<PathBuf>,
}

impl Spec {
    /// The spec of a validated `command` upstream; `None` for a `url` upstream.
    pub fn of(config: &UpstreamConfig) -> Option<Spec> {
        let command = config.command.as_ref()?;
        let (program, args) = command.split_first()?;
        // A relative path is against the child's `cwd` (as `check-config` checked it), not
        // taskgate's, whatever the platform's spawn does with it.
        let program = match &config.cwd {
            Some(cwd) if program.contains('/') && std::path::Path::new(program).is_relative() => {
                cwd.join(program).to_string_lossy().into_owned()
            }
            _ => program.clone(),
        };
        Some(Spec {
            name: config.name.as_str().into(),
            program,
            args: args.to_vec(),
            env: config
                .env
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            cwd: config.cwd.clone(),
        })
    }

    /// Starts the child (through the shim, when [`launch_through`] named one): stdin, stdout
    /// and stderr piped, its own process group, the parent-death signal set (see the module
    /// docs).
    ///
    /// Errors: the program (or the shim) could not be started; through the shim, a command
    /// that cannot be started is a child that exits at once (code 127 when not found, 126
    /// otherwise; the reason on its stderr, [`super::shim::START_FAILED`], which [`log_stderr`]
    /// recognises).
    pub fn spawn(&self) -> std::io::Result<Child> {
        let mut cmd = match LAUNCHER.get() {
            Some(launcher) => {
                let mut cmd = Command::new(launcher);
                cmd.arg0("taskgate")
                    .arg(super::shim::MODE)
                    .arg("--")
                    .arg(&self.program);
                cmd
            }
            None => Command::new(&self.program),
        };
        cmd.args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            // The group is ended by `shutdown`; a child dropped unwaited is still killed.
            .kill_on_drop(true);
        if let Some(cwd) = &self.cwd {
            cmd.current_dir(cwd);
        }
        // SAFETY: the closure runs in the forked child before exec and calls only
        // async-signal-safe functions (prctl, getppid, _exit), allocating nothing.
        let parent = std::process::id() as libc::pid_t;
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The parent died between fork and prctl: no signal will come.
                if libc::getppid() != parent {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
        cmd.spawn()
    }
}

/// `SIGKILL` to a child's process group should the task that owns the child be dropped before
/// it reaped it (a runtime torn down): `kill_on_drop` reaches the child (the shim) alone, and
/// what the command started in its group ran on. Disarmed once the child is reaped (its
/// group's id may be reused once the group is empty).
pub struct GroupGuard(Option<u32>);

impl GroupGuard {
    /// Guards the group `pgid` leads (`None`: nothing to guard).
    pub fn new(pgid: Option<u32>) -> GroupGuard {
        GroupGuard(pgid)
    }

    /// The child was reaped: nothing to do on drop.
    pub fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pgid) = self.0 {
            signal_group(pgid, libc::SIGKILL);
        }
    }
}

/// Sends `signal` to the process group `pgid` leads (ignored when the group is gone).
pub fn signal_group(pgid: u32, signal: libc::c_int) {
    let Ok(pgid) = libc::pid_t::try_from(pgid) else {
        return;
    };
    if pgid <= 1 {
        return;
    }
    // SAFETY: killpg has no memory effects; a group that no longer exists is ESRCH.
    unsafe {
        libc::killpg(pgid, signal);
    }
}

/// Ends a child and its process group: its stdin is already closed by the caller (dropped);
/// wait [`STDIN_GRACE`], `SIGTERM` the group, wait [`TERM_GRACE`], `SIGKILL` (through the
/// shim: the shim is asked to `SIGKILL` the command, its group and the orphans it adopted,
/// [`SHIM_END_WAIT`]; then, and without it, the group gets `SIGKILL`), reap. Returns how it
/// ended (for the log).
pub async fn end(name: &str, child: &mut Child) -> String {
    end_after(name, child, STDIN_GRACE).await
}

/// Ends a deaf child (one that stopped reading its stdin) as [`end`] does, but without waiting
/// [`STDIN_GRACE`] for it to exit on EOF: it reads nothing, so it never sees its stdin close.
pub async fn end_deaf(name: &str, child: &mut Child) -> String {
    end_after(name, child, Duration::ZERO).await
}

async fn end_after(name: &str, child: &mut Child, stdin_grace: Duration) -> String {
    let pgid = child.id();
    let how = if let Ok(status) = tokio::time::timeout(stdin_grace, child.wait()).await {
        format!("exited after stdin closed ({})", describe(status))
    } else {
        if let Some(pgid) = pgid {
            signal_group(pgid, libc::SIGTERM);
        }
        match tokio::time::timeout(TERM_GRACE, child.wait()).await {
            Ok(status) => format!("exited after SIGTERM ({})", describe(status)),
            Err(_) => {
                // Through the shim, it ends the command and all it left (what left the group
                // too, which the group's `SIGKILL` misses) and exits; the group's `SIGKILL`
                // stays for a shim that does not.
                let asked = LAUNCHER.get().is_some()
                    && pgid
                        .and_then(|p| libc::pid_t::try_from(p).ok())
                        .is_some_and(super::shim::ask_to_end_all);
                if asked {
                    let _ = tokio::time::timeout(SHIM_END_WAIT, child.wait()).await;
                }
                if let Some(pgid) = pgid {
                    signal_group(pgid, libc::SIGKILL);
                }
                let _ = child.kill().await;
                "killed (SIGKILL) after ignoring SIGTERM".to_string()
            }
        }
    };
    // The leader is gone; what it left in its group goes too.
    if let Some(pgid) = pgid {
        signal_group(pgid, libc::SIGKILL);
    }
    tracing::info!(target: "taskgate::upstream::stdio", upstream = %name, "child {how}");
    how
}

/// An exit status in words.
pub fn describe(status: std::io::Result<std::process::ExitStatus>) -> String {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(c), _) => format!("exit code {c}"),
            (None, Some(sig)) => format!("killed by signal {sig}"),
            _ => "unknown status".into(),
        },
        Err(e) => format!("wait failed: {e}"),
    }
}

/// Copies the child's stderr to taskgate's log (target `taskgate::upstream::stdio`, level
/// info), each line cut at [`STDERR_LINE_BYTES`], at most [`STDERR_LINES_PER_SECOND`] lines a
/// second. The rest are counted and the count logged at warn when their one-second window ends,
/// whether or not the child writes again (a burst followed by silence is reported within a
/// second, not at the child's next line or exit). Ends with the pipe.
///
/// The shim's line saying the command could not be started ([`super::shim::START_FAILED`])
/// also sets `not_started` (the first one, `<program>: <reason>`), logged or not.
pub async fn log_stderr(
    name: Arc<str>,
    stderr: impl tokio::io::AsyncRead + Unpin,
    not_started: Arc<OnceLock<String>>,
) {
    const WINDOW: Duration = Duration::from_secs(1);
    let dropped_lines = |dropped: u64| {
        tracing::warn!(target: "taskgate::upstream::stdio", upstream = %name, dropped, "child stderr lines not logged (over {STDERR_LINES_PER_SECOND} a second)");
    };
    // Lines are read at the stdout bound's order (64 KiB); what is logged is cut shorter.
    let mut lines = super::framing::Lines::new(stderr, 64 * 1024);
    let mut window = tokio::time::Instant::now();
    let (mut logged, mut dropped) = (0u32, 0u64);
    loop {
        // With lines dropped, the read waits until the window's end at most, to report them.
        // `Lines::next` is cancel-safe: what it read stays in its buffer.
        let next = if dropped > 0 {
            tokio::time::timeout_at(window + WINDOW, lines.next()).await
        } else {
            Ok(lines.next().await)
        };
        let line = match next {
            Ok(Ok(Some(line))) => Some(line),
            Ok(Ok(None) | Err(_)) => break,
            Err(_window_ended) => None,
        };
        let now = tokio::time::Instant::now();
        if now.duration_since(window) >= WINDOW {
            if dropped > 0 {
                dropped_lines(dropped);
            }
            window = now;
            logged = 0;
            dropped = 0;
        }
        let Some(line) = line else {
            continue;
        };
        if let super::framing::Line::Text(t) = &line {
            if let Some(reason) = t.strip_prefix(super::shim::START_FAILED) {
                let _ = not_started.set(cut(reason, STDERR_LINE_BYTES));
            }
        }
        if logged >= STDERR_LINES_PER_SECOND {
            dropped += 1;
            continue;
        }
        logged += 1;
        let text = match &line {
            super::framing::Line::Text(t) => cut(t, STDERR_LINE_BYTES),
            super::framing::Line::Oversize(_) => "(a line over 64 KiB, not logged)".into(),
            super::framing::Line::NotUtf8 => "(a line that is not UTF-8, not logged)".into(),
        };
        tracing::info!(target: "taskgate::upstream::stdio", upstream = %name, stderr = %text);
    }
    if dropped > 0 {
        dropped_lines(dropped);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A burst over the rate, then silence with the pipe still open: the count of the lines not
    /// logged is reported once the second ends (before: only at the child's next stderr line
    /// or its exit, so a child that went quiet never reported it).
    #[tokio::test(start_paused = true)]
    async fn a_burst_of_stderr_is_reported_when_its_second_ends() {
        use tokio::io::AsyncWriteExt;
        let logs = crate::test_log::Captured::default();
        let _guard = logs.install();
        let (mut child, stderr) = tokio::io::duplex(1 << 20);
        let burst = STDERR_LINES_PER_SECOND as usize + 150;
        child
            .write_all("line\n".repeat(burst).as_bytes())
            .await
            .unwrap();
        let logging = tokio::spawn(log_stderr("t".into(), stderr, Arc::default()));
        // Paused time: the sleep ends once every task waits, the logger in its read.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let text = logs.text();
        assert!(
            text.contains("dropped=150"),
            "the dropped lines are reported while the pipe is open: {text}"
        );
        drop(child);
        logging.await.unwrap();
        assert_eq!(
            logs.text().matches("not logged").count(),
            1,
            "{}",
            logs.text()
        );
    }

    #[test]
    fn cut_keeps_characters_whole() {
        assert_eq!(cut("abc", 3), "abc");
        assert_eq!(cut("abcd", 3), "abc…");
        assert_eq!(cut("aé", 2), "a…");
    }

    fn spec(program: &str, args: &[&str]) -> Spec {
        Spec {
            name: "t".into(),
            program: program.into(),
            args: args.iter().map(|a| a.to_string()).collect(),
            env: vec![("TG_TEST_VAR".into(), "x y".into())],
            cwd: None,
        }
    }

    #[tokio::test]
    async fn a_child_leads_its_own_group_and_gets_the_env() {
        let mut child = spec("sh", &["-c", "echo \"$TG_TEST_VAR\"; ps -o pgid= -p $$"])
            .spawn()
            .expect("sh starts");
        let pid = child.id().expect("running");
        let out = child.stdout.take().expect("piped");
        let mut lines = super::super::framing::Lines::new(out, 1024);
        let first = lines.next().await.expect("read");
        assert_eq!(first, Some(super::super::framing::Line::Text("x y".into())));
        if let Ok(Some(super::super::framing::Line::Text(pgid))) = lines.next().await {
            assert_eq!(pgid.trim(), pid.to_string(), "the child leads its group");
        }
        let _ = child.wait().await;
    }

    #[tokio::test]
    async fn end_escalates_to_sigkill_for_the_whole_group() {
        // The shell ignores SIGTERM and stdin EOF; its own child (sleep) is in its group.
        let mut child = spec("sh", &["-c", "trap '' TERM; sleep 30 & wait; sleep 30"])
            .spawn()
            .expect("sh starts");
        let pgid = child.id().expect("running");
        drop(child.stdin.take());
        let started = std::time::Instant::now();
        let how = end("t", &mut child).await;
        assert!(how.contains("SIGKILL"), "{how}");
        assert!(started.elapsed() < STDIN_GRACE + TERM_GRACE + Duration::from_secs(2));
        // Nothing of the group is left (the orphaned `sleep` is reaped by init: wait for it).
        let mut alive = true;
        for _ in 0..50 {
            // SAFETY: signal 0 only checks for existence.
            alive = unsafe { libc::killpg(pgid as libc::pid_t, 0) } == 0;
            if !alive {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(!alive, "the group is gone");
    }
}
