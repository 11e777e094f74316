//! A throwaway PostgreSQL for the tests that need one ([`PgCluster`]): the server named by
//! `TASKGATE_TEST_DATABASE_URL` when set, else a cluster of its own (`initdb` in a temporary
//! directory, a loopback port picked here, the socket directory inside the temporary directory,
//! run as the `postgres` user when the tests run as root), stopped on drop. Without either, a
//! test prints that it skipped, unless `TASKGATE_REQUIRE_PG=1` (set by `tests/run-all.sh` and
//! `.ci/run`), where that is a failure.

use super::*;
use std::os::unix::process::CommandExt;

/// A PostgreSQL the test may use; the cluster (if it started one) stops on drop.
pub struct PgCluster {
    /// `postgres://taskgate@127.0.0.1:PORT/postgres` (or the given URL).
    pub url: String,
    child: Option<Child>,
    _dir: Option<tempfile::TempDir>,
    /// With `TASKGATE_TEST_DATABASE_URL`: `(that URL, the database made for this test)`.
    server: Option<(String, String)>,
    /// A cluster of its own: how its server is started again ([`PgCluster::start_server`]).
    own: Option<Own>,
}

/// What starts a cluster's server: its binaries, data directory, port, TLS, and the user it
/// runs as when the tests run as root.
struct Own {
    bin: std::path::PathBuf,
    dir: std::path::PathBuf,
    port: u16,
    tls: bool,
    ids: Option<(u32, u32)>,
}

impl Own {
    fn cmd(&self, name: &str) -> Command {
        let mut c = Command::new(self.bin.join(name));
        if let Some((uid, gid)) = self.ids {
            c.uid(uid).gid(gid);
        }
        c.stdin(Stdio::null());
        c
    }

    /// Starts `postgres` on the data directory, its log appended to `postgres.log`.
    fn spawn(&self) -> Result<Child, String> {
        let path = self.dir.join("postgres.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap();
        if let Some((uid, gid)) = self.ids {
            let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
            unsafe { libc::chown(c.as_ptr(), uid, gid) };
        }
        let data = self.dir.join("data");
        self.cmd("postgres")
            .args(["-D", data.to_str().unwrap(), "-p", &self.port.to_string()])
            .args(["-k", self.dir.to_str().unwrap()])
            .args([
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "max_connections=300",
            ])
            .args(["-c", "fsync=off"])
            .args(if self.tls {
                &[
                    "-c",
                    "ssl=on",
                    "-c",
                    "ssl_cert_file=server.crt",
                    "-c",
                    "ssl_key_file=server.key",
                    // Client certificates are checked against the test CA (a `pg_hba.conf`
                    // `cert` line a test adds: `store.client_cert_file`).
                    "-c",
                    "ssl_ca_file=ca.crt",
                ][..]
            } else {
                &[][..]
            })
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("postgres: {e}"))
    }
}

static NEXT_DB: AtomicUsize = AtomicUsize::new(0);

/// `url` (`postgres://user@host:port/db?…`) naming database `db` instead.
fn with_database(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, format!("?{q}")),
        None => (url, String::new()),
    };
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let host_end = base[scheme_end..]
        .find('/')
        .map_or(base.len(), |i| scheme_end + i);
    format!("{}/{db}{query}", &base[..host_end])
}

/// Runs one statement on `url` (its own runtime and thread: callable from anywhere).
fn admin_sql(url: &str, sql: &str) -> Result<(), String> {
    let (url, sql) = (url.to_string(), sql.to_string());
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .map_err(|e| e.to_string())?;
            tokio::spawn(conn);
            client.batch_execute(&sql).await.map_err(|e| e.to_string())
        })
    })
    .join()
    .unwrap()
}

fn bin_dir() -> Option<std::path::PathBuf> {
    let mut dirs: Vec<_> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("bin"))
        .filter(|p| p.join("initdb").exists())
        .collect();
    dirs.sort_by_key(|p| {
        p.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    dirs.pop()
}

/// `(uid, gid)` of the `postgres` user, from `/etc/passwd`.
fn postgres_ids() -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    let line = passwd.lines().find(|l| l.starts_with("postgres:"))?;
    let f: Vec<&str> = line.split(':').collect();
    Some((f.get(2)?.parse().ok()?, f.get(3)?.parse().ok()?))
}

impl PgCluster {
    /// A database for `test`, or `None` (printed) when none can be had and none is required.
    pub fn start(test: &str) -> Option<PgCluster> {
        if let Ok(url) = std::env::var("TASKGATE_TEST_DATABASE_URL") {
            if !url.is_empty() {
                let name = format!(
                    "tg_{}_{}_{}",
                    std::process::id(),
                    now_ms(),
                    NEXT_DB.fetch_add(1, Ordering::SeqCst)
                );
                admin_sql(&url, &format!("CREATE DATABASE {name}"))
                    .unwrap_or_else(|e| panic!("{test}: CREATE DATABASE in {url}: {e}"));
                return Some(PgCluster {
                    url: with_database(&url, &name),
                    child: None,
                    _dir: None,
                    server: Some((url, name)),
                    own: None,
                });
            }
        }
        match Self::own_cluster(false) {
            Ok(c) => Some(c),
            Err(why) => {
                if std::env::var("TASKGATE_REQUIRE_PG").as_deref() == Ok("1") {
                    panic!("{test}: PostgreSQL is required (TASKGATE_REQUIRE_PG=1) but: {why}");
                }
                eprintln!("SKIPPED {test}: no PostgreSQL ({why}); set TASKGATE_TEST_DATABASE_URL or install postgresql");
                None
            }
        }
    }

    /// A cluster of its own, never `TASKGATE_TEST_DATABASE_URL`'s: for a test that stops and
    /// starts the server ([`PgCluster::stop_server`]) or freezes it. `None` (printed) as
    /// [`PgCluster::start`] when PostgreSQL is missing and not required. (These tests were
    /// skipped under the suite's shared server, that is in every CI run, until 2026-12-07.)
    pub fn start_own(test: &str) -> Option<PgCluster> {
        match Self::own_cluster(false) {
            Ok(c) => Some(c),
            Err(why) => {
                if std::env::var("TASKGATE_REQUIRE_PG").as_deref() == Ok("1") {
                    panic!("{test}: PostgreSQL is required (TASKGATE_REQUIRE_PG=1) but: {why}");
                }
                eprintln!("SKIPPED {test}: no PostgreSQL of its own ({why})");
                None
            }
        }
    }

    /// A cluster of its own (never `TASKGATE_TEST_DATABASE_URL`'s) serving TLS with a certificate
    /// for IP 127.0.0.1 only, issued by a throwaway CA; returns it and the CA's PEM file. `None`
    /// (printed) as [`PgCluster::start`] when PostgreSQL or openssl is missing and not required.
    pub fn start_tls(test: &str) -> Option<(PgCluster, std::path::PathBuf)> {
        match Self::own_cluster(true) {
            Ok(c) => {
                let ca = c._dir.as_ref().unwrap().path().join("ca.crt");
                Some((c, ca))
            }
            Err(why) => {
                if std::env::var("TASKGATE_REQUIRE_PG").as_deref() == Ok("1") {
                    panic!("{test}: PostgreSQL with TLS is required (TASKGATE_REQUIRE_PG=1) but: {why}");
                }
                eprintln!("SKIPPED {test}: no PostgreSQL with TLS ({why})");
                None
            }
        }
    }

    fn own_cluster(tls: bool) -> Result<PgCluster, String> {
        let bin = bin_dir().ok_or("no /usr/lib/postgresql/*/bin/initdb")?;
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let root = unsafe { libc::geteuid() } == 0;
        let ids = if root {
            let ids = postgres_ids().ok_or("running as root and no postgres user")?;
            let c = std::ffi::CString::new(dir.path().to_str().unwrap()).unwrap();
            unsafe { libc::chown(c.as_ptr(), ids.0, ids.1) };
            Some(ids)
        } else {
            None
        };
        let cmd = |name: &str| {
            let mut c = Command::new(bin.join(name));
            if let Some((uid, gid)) = ids {
                c.uid(uid).gid(gid);
            }
            c.stdin(Stdio::null());
            c
        };
        let data = dir.path().join("data");
        let out = cmd("initdb")
            .args([
                "-D",
                data.to_str().unwrap(),
                "-U",
                "taskgate",
                "-A",
                "trust",
            ])
            .args(["-E", "UTF8", "--no-sync", "--no-instructions"])
            .output()
            .map_err(|e| format!("initdb: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "initdb failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        if tls {
            make_certs(dir.path(), &data, ids)?;
        }
        let own = Own {
            bin: bin.clone(),
            dir: dir.path().to_path_buf(),
            port: free_port(),
            tls,
            ids,
        };
        let port = own.port;
        let child = own.spawn()?;
        let mut cluster = PgCluster {
            url: format!("postgres://taskgate@127.0.0.1:{port}/postgres"),
            child: Some(child),
            _dir: Some(dir),
            server: None,
            own: Some(own),
        };
        cluster.wait_ready()?;
        Ok(cluster)
    }

    /// Stops the server as `pg_ctl stop -m fast` does (SIGINT: sessions are ended, connections
    /// closed, new ones refused) and waits until it exited.
    ///
    /// Panics for a server not its own ([`PgCluster::start_own`]).
    pub fn stop_server(&mut self) {
        assert!(self.own.is_some(), "not a cluster of its own");
        let Some(mut child) = self.child.take() else {
            return;
        };
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        let until = Instant::now() + STEP * 3;
        while Instant::now() < until {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Starts the stopped server again on its port and data directory; returns once it accepts
    /// connections. Panics for a server not its own, or one that does not come back.
    pub fn start_server(&mut self) {
        let own = self.own.as_ref().expect("not a cluster of its own");
        assert!(self.child.is_none(), "the server runs");
        self.child = Some(own.spawn().expect("postgres starts again"));
        self.wait_ready()
            .expect("postgres accepts connections again");
    }

    /// Freezes the server (SIGSTOP to the postmaster and every process it started): connections
    /// stay open and nothing answers, new ones are accepted by the kernel and wait (a database
    /// that hangs). [`PgCluster::resume_server`] thaws it. Panics for a server not its own.
    pub fn pause_server(&self) {
        self.signal_all(libc::SIGSTOP);
    }

    /// Thaws a server [`PgCluster::pause_server`] froze.
    pub fn resume_server(&self) {
        self.signal_all(libc::SIGCONT);
    }

    /// `sig` to the postmaster and its children (read from /proc: their parent is the postmaster).
    fn signal_all(&self, sig: i32) {
        assert!(self.own.is_some(), "not a cluster of its own");
        let Some(child) = self.child.as_ref() else {
            return;
        };
        let postmaster = child.id() as i32;
        // The postmaster first when stopping, before its children are listed: a backend it
        // forked between the listing and its stop kept answering (a "hung" server whose
        // `/readyz` ping said ok, `the_tier_rides_out_a_hung_database`); last when resuming.
        if sig == libc::SIGSTOP {
            unsafe { libc::kill(postmaster, sig) };
        }
        let children: Vec<i32> = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .ok()
                    .and_then(|s| {
                        let rest = &s[s.rfind(')')? + 2..];
                        rest.split(' ').nth(1)?.parse::<i32>().ok()
                    })
                    == Some(postmaster)
            })
            .collect();
        for pid in children {
            unsafe { libc::kill(pid, sig) };
        }
        if sig != libc::SIGSTOP {
            unsafe { libc::kill(postmaster, sig) };
        }
    }

    /// Waits until the server accepts connections (30 s at most).
    fn wait_ready(&mut self) -> Result<(), String> {
        let own = self.own.as_ref().expect("a cluster of its own");
        let (bin, port) = (own.bin.clone(), own.port);
        let until = Instant::now() + STEP * 3;
        loop {
            let ready = Command::new(bin.join("pg_isready"))
                .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-q"])
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if ready {
                return Ok(());
            }
            if let Some(Ok(Some(s))) = self.child.as_mut().map(|c| c.try_wait()) {
                return Err(format!("postgres exited: {s}"));
            }
            if Instant::now() > until {
                return Err("postgres did not accept connections in 30 s".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        if let Some((url, name)) = self.server.take() {
            let _ = admin_sql(
                &url,
                &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
            );
        }
        if self.own.is_some() {
            // A server a failed test left frozen takes its signals again.
            self.signal_all(libc::SIGCONT);
        }
        let Some(mut child) = self.child.take() else {
            return;
        };
        // Immediate shutdown (SIGQUIT), then SIGKILL if it lingers.
        unsafe { libc::kill(child.id() as i32, libc::SIGQUIT) };
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// A throwaway CA (`dir/ca.crt`) and a server certificate for IP 127.0.0.1 only
/// (`data/server.crt`, `data/server.key`, owned by `ids` when given), with the openssl CLI.
fn make_certs(
    dir: &std::path::Path,
    data: &std::path::Path,
    ids: Option<(u32, u32)>,
) -> Result<(), String> {
    let run = |args: &[&str]| -> Result<(), String> {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("openssl: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "openssl {}: {}",
                args[0],
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    };
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n")
        .map_err(|e| e.to_string())?;
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=taskgate test CA",
    ])?;
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    ])?;
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "2",
        "-extfile",
        "san.ext",
    ])?;
    // A client certificate for the role `tgcert` (the `cert` method matches the CN to the role);
    // v3 with extensions (webpki refuses a v1 certificate).
    std::fs::write(
        dir.join("client.ext"),
        "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n",
    )
    .map_err(|e| e.to_string())?;
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "client.key",
        "-out",
        "client.csr",
        "-subj",
        "/CN=tgcert",
    ])?;
    run(&[
        "x509",
        "-req",
        "-in",
        "client.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "client.crt",
        "-days",
        "2",
        "-extfile",
        "client.ext",
    ])?;
    for name in ["server.crt", "server.key", "ca.crt"] {
        let to = data.join(name);
        std::fs::copy(dir.join(name), &to).map_err(|e| e.to_string())?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| e.to_string())?;
        if let Some((uid, gid)) = ids {
            let c = std::ffi::CString::new(to.to_str().unwrap()).unwrap();
            unsafe { libc::chown(c.as_ptr(), uid, gid) };
        }
    }
    Ok(())
}

/// A TCP proxy in front of a PostgreSQL whose forwarding can be stopped ([`BlackHole::stop`]):
/// from then on what either side sends is read and dropped (a black-holed path: no answer, no
/// error, TCP itself stays happy), while a side that closes still closes the other; and resumed
/// ([`BlackHole::resume`]): what is sent from then on is forwarded again (what was dropped stays
/// lost, so a connection used meanwhile is out of step with its server). It can also pace what
/// it forwards ([`BlackHole::pace`]): a database that answers, slowly.
pub struct BlackHole {
    /// Where to connect instead of the server.
    pub addr: SocketAddr,
    stopped: Arc<std::sync::atomic::AtomicBool>,
    /// Milliseconds to wait after forwarding each chunk read (at most 16 KiB); 0: none.
    pace_ms: Arc<std::sync::atomic::AtomicU64>,
    accept: tokio::task::JoinHandle<()>,
}

impl BlackHole {
    /// Listens on a loopback port and forwards every connection to `url`'s host and port.
    pub async fn start(url: &str) -> BlackHole {
        let target = tokio::net::lookup_host(authority(url))
            .await
            .unwrap()
            .next()
            .expect("the database URL names a host");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stopped = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stopped.clone();
        let pace_ms = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let pace = pace_ms.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(target).await else {
                    continue;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(pump(cr, sw, flag.clone(), pace.clone()));
                tokio::spawn(pump(sr, cw, flag.clone(), pace.clone()));
            }
        });
        BlackHole {
            addr,
            stopped,
            pace_ms,
            accept,
        }
    }

    /// `url` connecting through this proxy.
    pub fn url(&self, url: &str) -> String {
        url.replacen(&authority(url), &self.addr.to_string(), 1)
    }

    /// Stops forwarding (see the type's docs).
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
    }

    /// Forwards again (see the type's docs).
    pub fn resume(&self) {
        self.stopped.store(false, Ordering::SeqCst);
    }

    /// Waits `per_chunk` after forwarding each chunk (at most 16 KiB) in either direction: every
    /// byte arrives, at a pace (a slow link).
    pub fn pace(&self, per_chunk: Duration) {
        self.pace_ms
            .store(per_chunk.as_millis() as u64, Ordering::SeqCst);
    }
}

impl Drop for BlackHole {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// `host:port` of a `postgres://user@host:port/db?…` URL.
fn authority(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    rest[..end].to_string()
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    stopped: Arc<std::sync::atomic::AtomicBool>,
    pace_ms: Arc<std::sync::atomic::AtomicU64>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) if !stopped.load(Ordering::SeqCst) => {
                if to.write_all(&buf[..n]).await.is_err() {
                    break;
                }
                let pace = pace_ms.load(Ordering::SeqCst);
                if pace > 0 {
                    tokio::time::sleep(Duration::from_millis(pace)).await;
                }
            }
            Ok(_) => {}
        }
    }
    let _ = to.shutdown().await;
}
