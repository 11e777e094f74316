//! The store's group commit wakes one of sled's I/O threads, not all of them (issue 36).
//!
//! Each group commit (`Db::flush`) hands the sealed log buffer to sled's global I/O thread pool.
//! sled 0.34.7's pool woke all seven of its waiting threads for every job, six of them for
//! nothing: ~6 context switches per commit, about one commit per task on the lifecycle. taskgate
//! builds the sled of `vendor/sled/` (`vendor/sled/TASKGATE.md`), whose pool wakes one. This
//! pins it: a build that lost the patch (the `[patch.crates-io]` entry, a newer sled) fails here.
//!
//! The pool is the process's, and the other tests of this crate use sled at the same time: the
//! test counts in a process of its own, this test binary run again on this test alone with
//! `TASKGATE_SLED_POOL_PROBE` set.

/// The probe's switch: set, the test counts; unset, it runs the probe and reads its verdict.
const PROBE: &str = "TASKGATE_SLED_POOL_PROBE";
/// Flushes counted.
const FLUSHES: u64 = 100;

#[cfg(target_os = "linux")]
#[test]
fn a_commit_wakes_one_sled_io_thread_not_all_seven() {
    if std::env::var_os(PROBE).is_none() {
        let name = "store_io_wakeups::a_commit_wakes_one_sled_io_thread_not_all_seven";
        let out = std::process::Command::new(std::env::current_exe().expect("the test binary"))
            .args(["--exact", name, "--test-threads=1", "--nocapture"])
            .env(PROBE, "1")
            .output()
            .expect("the probe runs");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "the probe failed:\n{said}");
        assert!(said.contains("1 passed"), "the probe ran no test:\n{said}");
        return;
    }
    let dir = tempfile::tempdir().expect("a temp dir");
    let db = sled::Config::new()
        .path(dir.path())
        .flush_every_ms(None)
        .open()
        .expect("sled opens");
    db.insert(b"warm", b"up").expect("insert");
    db.flush().expect("flush");
    // The pool starts its seven threads with the first job: counted once they all wait.
    let before = settled();
    for i in 0..FLUSHES {
        db.insert(i.to_be_bytes(), &b"v"[..]).expect("insert");
        db.flush().expect("flush");
    }
    let after = io_thread_switches().1;
    let per_commit = (after - before) as f64 / FLUSHES as f64;
    eprintln!("sled-io voluntary context switches per commit: {per_commit:.2}");
    // One woken thread: its write's wait and its own sleep again, ~2. All seven woken: ~8.
    assert!(
        per_commit < 5.0,
        "{per_commit:.2} context switches of sled's I/O threads per commit: the pool wakes all its threads for each job (vendor/sled/TASKGATE.md)"
    );
}

/// The I/O threads' switches once seven of them exist and none switched over 50 ms.
#[cfg(target_os = "linux")]
fn settled() -> u64 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut last = io_thread_switches();
    loop {
        std::thread::sleep(std::time::Duration::from_millis(50));
        let now = io_thread_switches();
        if (now.0 >= 7 && now == last) || std::time::Instant::now() > deadline {
            return now.1;
        }
        last = now;
    }
}

/// How many of this process's threads are sled's I/O threads (`sled-io-N`), and their
/// voluntary context switches together (`/proc/self/task/*/status`).
#[cfg(target_os = "linux")]
fn io_thread_switches() -> (usize, u64) {
    let mut found = (0, 0);
    for task in std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .flatten()
    {
        let path = task.path();
        let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        if !comm.starts_with("sled-io") {
            continue;
        }
        let status = std::fs::read_to_string(path.join("status")).unwrap_or_default();
        let switches = status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
        found = (found.0 + 1, found.1 + switches);
    }
    found
}
