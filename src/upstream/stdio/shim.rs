//! The stdio child's shim: `taskgate __stdio-child -- <command…>`, the process taskgate starts
//! for each stdio child when it runs as the `taskgate` binary ([`super::child::launch_through`]),
//! so that no process of the child's outlives a `kill -9` of taskgate (tester 3 F23).
//!
//! Why: the kernel's parent-death signal (`PR_SET_PDEATHSIG`) reaches only the process taskgate
//! started. A server started through a wrapper that forks (`bash -c "server; …"`, `npx` → `sh`
//! → `node`, `uv run`) is that process's child: it went on running with parent 1 when taskgate
//! was killed, unless it happened to exit on its stdin's end. Nothing in taskgate runs after a
//! `kill -9`, so a process of its own must stay beside the command to end it.
//!
//! What the shim does (Linux):
//! - it keeps taskgate's parent-death signal as a catchable `SIGTERM` (taskgate starts it with
//!   `SIGKILL`, which stays in force until the shim replaces it, before it starts anything), and
//!   becomes a child subreaper (`PR_SET_CHILD_SUBREAPER`), so the command's orphans are its
//!   children, not init's;
//! - it starts the command with its own stdin, stdout and stderr (the pipes to taskgate, passed
//!   on: nothing is copied), in its process group (which taskgate created for it), then lets go
//!   of its copies of stdin and stdout (so the command closing either is seen by taskgate);
//! - when the command exits, whatever it left behind (its process group and its orphans) gets
//!   `SIGKILL`, as taskgate does to the group once the leader exits, and the shim exits with
//!   the command's status (a command killed by a signal: the shim dies by the same signal), so
//!   taskgate sees the command's own end;
//! - when taskgate dies (the parent-death signal, or its parent is no longer taskgate), the
//!   group (`killpg`) and its orphans get `SIGTERM`, then `SIGKILL` after [`TERM_GRACE`], and
//!   last the whole group `SIGKILL` by `killpg`, the shim included;
//! - taskgate's own stops signal the group, the shim included: it takes the signals it is sent
//!   by taskgate as meant for the command (which got them too) and waits for the command's end,
//!   so graceful stops work as without it; a signal from anyone else is passed on to the
//!   command;
//! - when taskgate escalates a stop to `SIGKILL`, it first asks the shim alone
//!   ([`ask_to_end_all`]: `SIGTERM` queued with a value): the shim `SIGKILL`s the command, then
//!   its group and its orphans as on the command's end, so what left the group (`setsid`) goes
//!   too (review L1), and exits; taskgate's `killpg(SIGKILL)` of the group follows.
//!
//! What can remain: the group is reached by `killpg` (taskgate's, or the shim's own), `/proc`
//! or not; processes that left the group are reached only through the shim (they are its
//! children once their parents died: it is a subreaper), found in `/proc`. Once the shim itself
//! is gone (`SIGKILL`ed by someone, taskgate's own `killpg(SIGKILL)` when the shim did not end
//! the rest within `child::SHIM_END_WAIT`, or taskgate's runtime dropped the child unreaped:
//! `child::GroupGuard`), its orphans are adopted by init and run on; so do they without
//! `/proc`.
//!
//! The shim runs no runtime and allocates only at its start and when it scans `/proc` to find
//! what the command left.

use std::ffi::OsString;
use std::time::{Duration, Instant};

/// The argument that starts `taskgate` as a stdio child's shim (not a user-facing command).
pub const MODE: &str = "__stdio-child";

/// How the shim's stderr line begins when it cannot start the command (exec failed: not
/// found, not executable, a missing interpreter), before `<program>: <reason>`
/// ([`not_started`]). taskgate recognises it (`child::log_stderr`) in a child that exits 127
/// or 126, and names the reason in `/readyz` and its log instead of the bare exit code.
pub const START_FAILED: &str = "taskgate __stdio-child: command could not be started: ";

/// `<program>: <reason>` for a command that could not be started (`e`, from its exec), the
/// OS error's number left out: "/srv/server: No such file or directory".
pub fn not_started(program: &std::ffi::OsStr, e: &std::io::Error) -> String {
    let reason = e.to_string();
    let reason = reason
        .rsplit_once(" (os error ")
        .map_or(reason.as_str(), |(text, _)| text);
    format!("{}: {reason}", program.to_string_lossy())
}

/// Signals the shim does not take (every other one is blocked and waited for): those no
/// process can block, and the faults of its own code, which must end it. Why every other one:
/// the shim is now the process taskgate logs as the child and its group's leader, so a signal
/// meant for the server (`kill -USR1 <pid>`: a log reopen, a dump) reaches it first; with only
/// the stops taken, such a signal killed the shim by its default action, the command got
/// `SIGKILL` from its parent-death signal and what it had started was left behind (review).
/// What it takes it passes on to the command, unless taskgate sent it to the whole group.
const NOT_TAKEN: [libc::c_int; 9] = [
    libc::SIGKILL,
    libc::SIGSTOP,
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGFPE,
    libc::SIGILL,
    libc::SIGTRAP,
    libc::SIGSYS,
    libc::SIGABRT,
];

/// How long what the command left may take to exit after `SIGTERM` when taskgate died, before
/// it gets `SIGKILL` (as long as a graceful stop gives a group: `child::TERM_GRACE`).
pub const TERM_GRACE: Duration = Duration::from_secs(3);

/// How long the shim waits for a signal before it checks its parent again.
const TICK: Duration = Duration::from_secs(1);

/// The value taskgate queues with [`END_ALL_SIGNAL`] (`sigqueue`) to the shim alone when it
/// escalates a stop to `SIGKILL` ([`ask_to_end_all`]).
const END_ALL: libc::c_int = 0x7467_6b6c;

/// The signal that carries [`END_ALL`]: one the shim takes, and, sent to it alone by its
/// parent with that value, told apart from a stop taskgate sent the whole group.
const END_ALL_SIGNAL: libc::c_int = libc::SIGTERM;

/// Asks the shim `pid` (started by this process) to end its command and everything it left at
/// once (`SIGKILL`): the command's process group and the orphans it adopted, also those that
/// left the group, which a `SIGKILL` of the group misses (review L1); it then exits as the
/// command did (killed by `SIGKILL`). Returns whether the request was sent.
pub fn ask_to_end_all(pid: libc::pid_t) -> bool {
    let value = libc::sigval {
        sival_ptr: END_ALL as usize as *mut libc::c_void,
    };
    // SAFETY: a plain system call; the value is a number, not a pointer anyone reads.
    unsafe { libc::sigqueue(pid, END_ALL_SIGNAL, value) == 0 }
}

/// Runs the shim for `args` (`--` then the command and its arguments) and never returns: the
/// process exits as the command did. Exit code 2 without a command; 127 (126) when the command
/// cannot be started (not found; otherwise), with the reason on stderr: a [`START_FAILED`]
/// line.
pub fn run(args: Vec<OsString>) -> ! {
    let mut args = args.into_iter().peekable();
    if args.peek().is_some_and(|a| a == "--") {
        args.next();
    }
    let Some(program) = args.next() else {
        eprintln!("taskgate {MODE}: no command given");
        std::process::exit(2);
    };
    // SAFETY: plain system calls on this process; no memory is shared with them.
    let parent = unsafe { libc::getppid() };
    let taken = taken_set();
    // SAFETY: as above; `taken` is a valid, initialized set.
    unsafe {
        libc::sigprocmask(libc::SIG_BLOCK, &taken, std::ptr::null_mut());
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong);
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong);
        // taskgate died before the signal was in force: nothing was started, nothing to end.
        if libc::getppid() != parent {
            std::process::exit(1);
        }
    }
    let command = match start(&program, args) {
        Ok(child) => child.id() as libc::pid_t,
        Err(e) => {
            eprintln!("{START_FAILED}{}", not_started(&program, &e));
            let code = if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
            std::process::exit(code);
        }
    };
    let_go_of_stdin_and_stdout();
    loop {
        let (signal, sender, queued) = wait_for(&taken, TICK);
        if let Some(status) = reap(command) {
            end_the_rest(Duration::ZERO);
            exit_as(status);
        }
        // SAFETY: a plain system call.
        if unsafe { libc::getppid() } != parent {
            end_the_rest(TERM_GRACE);
            // What /proc did not show of the group (or all of it, without /proc) goes too, and
            // the shim with it: nobody waits for its status now.
            signal_own_group(libc::SIGKILL);
            std::process::exit(1);
        }
        match signal {
            // A child's end; a broken pipe is the shim's own write's (its stderr), not the
            // command's.
            Some(libc::SIGCHLD | libc::SIGPIPE) | None => {}
            // taskgate's escalation (`ask_to_end_all`): the command's end, reaped above at the
            // next signal, ends the rest at once.
            Some(END_ALL_SIGNAL) if sender == parent && queued == Some(END_ALL) => {
                // SAFETY: a plain system call.
                unsafe { libc::kill(command, libc::SIGKILL) };
            }
            // taskgate's stops go to the whole group, the service manager's to every process
            // of the service: the command has it already.
            Some(_) if !passes_on(sender, parent) => {}
            Some(signal) => {
                // SAFETY: a plain system call.
                unsafe { libc::kill(command, signal) };
            }
        }
    }
}

/// Whether a signal `sender` sent the shim is passed on to the command (the shim's parent is
/// `parent`): not when it is taskgate's (its stops go to the whole group) nor pid 1's. Pid 1
/// signals the shim itself only when it signals every process of the service: systemd's
/// `KillMode=control-group` stop (`SIGTERM`, then `SIGCONT`), `systemctl kill` (its
/// `--kill-whom=all`), so the command got it directly, and passing it on made it get the stop
/// twice (review L3; a server may take a second `SIGTERM` as "stop now"). A container's init
/// (pid 1) signals its own child, or that child's group, which the shim is not in; when
/// taskgate itself is pid 1 it is the parent. A per-user service manager (`systemd --user`)
/// is not pid 1: its signals are passed on, so such a command gets a stop twice
/// (`KillMode=mixed` avoids it: README, Deploy).
fn passes_on(sender: libc::pid_t, parent: libc::pid_t) -> bool {
    sender != parent && sender != 1
}

/// The signals the shim takes: all but [`NOT_TAKEN`].
fn taken_set() -> libc::sigset_t {
    // SAFETY: sigfillset initializes the set; sigdelset only clears bits in it.
    unsafe {
        let mut set = std::mem::zeroed::<libc::sigset_t>();
        libc::sigfillset(&mut set);
        for signal in NOT_TAKEN {
            libc::sigdelset(&mut set, signal);
        }
        set
    }
}

/// Starts the command with the shim's stdin, stdout, stderr, environment and directory, no
/// signal blocked (the shim blocks the ones it takes) and the shim's death its own
/// (`PR_SET_PDEATHSIG`, `SIGKILL`: should the shim itself be killed alone).
fn start(
    program: &OsString,
    args: impl Iterator<Item = OsString>,
) -> std::io::Result<std::process::Child> {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new(program);
    cmd.args(args);
    // SAFETY: getpid before the fork; the closure calls only async-signal-safe functions.
    let shim = unsafe { libc::getpid() };
    unsafe {
        cmd.pre_exec(move || {
            // Not the shim's blocked signals: the command starts with none blocked.
            let mut none = std::mem::zeroed::<libc::sigset_t>();
            libc::sigemptyset(&mut none);
            libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() != shim {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    cmd.spawn()
}

/// Points the shim's own stdin and stdout at `/dev/null`: the command holds the pipes now, and
/// taskgate must see it close them.
fn let_go_of_stdin_and_stdout() {
    // SAFETY: plain system calls on this process's descriptors.
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
        if null >= 0 {
            libc::dup2(null, 0);
            libc::dup2(null, 1);
            libc::close(null);
        } else {
            libc::close(0);
            libc::close(1);
        }
    }
}

/// Waits up to `within` for one of the `taken` signals: which one, who sent it, and the value
/// queued with it (`sigqueue`), if it was queued.
fn wait_for(
    taken: &libc::sigset_t,
    within: Duration,
) -> (Option<libc::c_int>, libc::pid_t, Option<libc::c_int>) {
    let timeout = libc::timespec {
        tv_sec: within.as_secs() as libc::time_t,
        tv_nsec: within.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `info` is written by the kernel; `si_pid` reads the union's sender field, which
    // every signal sent with kill or sigqueue (and SIGCHLD) fills; `si_value` is read only for
    // a queued one (`SI_QUEUE`), which fills it.
    unsafe {
        let mut info = std::mem::zeroed::<libc::siginfo_t>();
        let signal = libc::sigtimedwait(taken, &mut info, &timeout);
        if signal <= 0 {
            (None, 0, None)
        } else {
            let queued = (info.si_code == libc::SI_QUEUE)
                .then(|| info.si_value().sival_ptr as usize as libc::c_int);
            (Some(signal), info.si_pid(), queued)
        }
    }
}

/// Reaps every child that ended (the command, and orphans the shim adopted); the command's
/// wait status when it was among them.
fn reap(command: libc::pid_t) -> Option<libc::c_int> {
    let mut found = None;
    loop {
        let mut status = 0;
        // SAFETY: a plain system call writing `status`.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            return found;
        }
        if pid == command {
            found = Some(status);
        }
    }
}

/// The processes the command left: in the shim's process group (when the shim leads it, as
/// taskgate starts it: never a group it was merely started in), or adopted by it (orphans that
/// left the group), not zombies, the shim excepted.
fn the_rest() -> Vec<libc::pid_t> {
    // SAFETY: plain system calls.
    let (me, group) = unsafe { (libc::getpid(), libc::getpgrp()) };
    let group = (group == me).then_some(group);
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<libc::pid_t>().ok())
        .filter(|&pid| pid != me)
        .filter(|&pid| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                return false;
            };
            // `pid (comm) state ppid pgrp …`: the command name may hold anything but ends at
            // the last ')'.
            let Some((_, rest)) = stat.rsplit_once(')') else {
                return false;
            };
            let mut fields = rest.split_ascii_whitespace();
            let state = fields.next().unwrap_or("Z");
            let ppid = fields.next().and_then(|f| f.parse::<libc::pid_t>().ok());
            let pgrp = fields.next().and_then(|f| f.parse::<libc::pid_t>().ok());
            state != "Z" && ((group.is_some() && pgrp == group) || ppid == Some(me))
        })
        .collect()
}

/// Whether `pid` is in the process group the shim leads.
fn in_own_group(pid: libc::pid_t) -> bool {
    // SAFETY: plain system calls.
    unsafe {
        let me = libc::getpid();
        libc::getpgrp() == me && libc::getpgid(pid) == me
    }
}

/// Sends `signal` to the shim's process group when the shim leads it (as taskgate starts it),
/// the shim included: no `/proc` needed.
fn signal_own_group(signal: libc::c_int) {
    // SAFETY: plain system calls.
    unsafe {
        let me = libc::getpid();
        if libc::getpgrp() == me {
            libc::killpg(me, signal);
        }
    }
}

/// Ends what the command left: `SIGTERM`, then `SIGKILL` once `grace` is over (at once without
/// one), reaping what it adopted; returns when nothing is left, or 2 s after the `SIGKILL`.
///
/// The `SIGTERM` goes to the shim's group with `killpg` (the shim takes it: blocked), so every
/// member gets it, `/proc` or not; the orphans that left the group, and the `SIGKILL`s (a
/// `killpg` would end the shim too, which must exit with the command's status), go by the
/// pids `/proc` shows ([`the_rest`]). Without `/proc` what is left of the group gets
/// taskgate's `SIGKILL` once the shim exited (`child::signal_group`), or, when taskgate died,
/// the shim's own ([`signal_own_group`]); orphans that left the group are not found then.
fn end_the_rest(grace: Duration) {
    let started = Instant::now();
    let mut termed: Vec<libc::pid_t> = Vec::new();
    let taken = taken_set();
    if !grace.is_zero() {
        signal_own_group(libc::SIGTERM);
    }
    loop {
        reap(0);
        let rest = the_rest();
        if rest.is_empty() {
            return;
        }
        let elapsed = started.elapsed();
        for pid in rest {
            if elapsed >= grace {
                // SAFETY: a plain system call.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            } else if !termed.contains(&pid) && !in_own_group(pid) {
                // The group had its `SIGTERM` (`killpg`); this one left it.
                // SAFETY: a plain system call.
                unsafe { libc::kill(pid, libc::SIGTERM) };
                termed.push(pid);
            }
        }
        if elapsed >= grace + Duration::from_secs(2) {
            return;
        }
        // Woken early by a child's end.
        wait_for(&taken, Duration::from_millis(50));
    }
}

/// Exits as the command did: its exit code, or death by its signal (no core file).
fn exit_as(status: libc::c_int) -> ! {
    if libc::WIFSIGNALED(status) {
        let signal = libc::WTERMSIG(status);
        // SAFETY: plain system calls on this process: the signal's default action, unblocked.
        unsafe {
            let no_core = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::setrlimit(libc::RLIMIT_CORE, &no_core);
            libc::signal(signal, libc::SIG_DFL);
            let mut set = std::mem::zeroed::<libc::sigset_t>();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, signal);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::raise(signal);
        }
        std::process::exit(128 + signal);
    }
    std::process::exit(libc::WEXITSTATUS(status));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Review L3: a signal from pid 1 (systemd signals every process of a service: the
    /// command has it too) or from taskgate (its stops go to the group) is not passed on; one
    /// from anyone else (`kill -USR1 <pid>`) is.
    #[test]
    fn only_signals_the_command_did_not_get_are_passed_on() {
        assert!(!passes_on(1, 4242), "the service manager's");
        assert!(!passes_on(4242, 4242), "taskgate's");
        assert!(passes_on(777, 4242), "anyone else's");
        assert!(!passes_on(1, 1), "taskgate as pid 1");
    }

    #[test]
    fn a_start_failure_names_the_program_and_the_reason() {
        let e = std::io::Error::from_raw_os_error(libc::ENOENT);
        assert_eq!(
            not_started(std::ffi::OsStr::new("/srv/x"), &e),
            "/srv/x: No such file or directory"
        );
    }
}
