//! A real load balancer for tier tests ([`Balancer`]): nginx (Debian's `nginx`), round-robin, no
//! stickiness, in front of the given backends; its own prefix, config and temp paths in a
//! temporary directory; stopped on drop. `None` (printed) when nginx is not installed, unless
//! `TASKGATE_REQUIRE_PG=1` (then a failure: `.ci/run` installs it). [`Balancer::sticky`]:
//! HAProxy (Debian's `haproxy`) with the session stickiness `deploy/README.md` documents for
//! 2025-11-25 sessions under authentication (stick on the `Mcp-Session-Id` the response set).

use super::*;

/// nginx on 127.0.0.1:`port`, round-robin over `backends`.
pub struct Balancer {
    pub addr: SocketAddr,
    child: Child,
    dir: tempfile::TempDir,
}

fn nginx_bin() -> Option<std::path::PathBuf> {
    ["/usr/sbin/nginx", "/usr/bin/nginx", "/usr/local/sbin/nginx"]
        .iter()
        .map(std::path::PathBuf::from)
        .find(|p| p.exists())
}

/// The nginx `http` block the tier tests use; also the shape `deploy/` documents.
pub fn nginx_conf(dir: &std::path::Path, port: u16, backends: &[SocketAddr]) -> String {
    let d = dir.display();
    let servers: String = backends
        .iter()
        .map(|b| format!("    server {b} max_fails=1 fail_timeout=5s;\n"))
        .collect();
    let user = if unsafe { libc::geteuid() } == 0 {
        "user root root;\n"
    } else {
        ""
    };
    format!(
        "{user}daemon off;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
         events {{ worker_connections 4096; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n\
         \x20 fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
         \x20 upstream taskgate {{\n{servers}    keepalive 64;\n  }}\n\
         \x20 server {{\n    listen 127.0.0.1:{port};\n    location / {{\n\
         \x20     proxy_pass http://taskgate;\n      proxy_http_version 1.1;\n\
         \x20     proxy_set_header Connection \"\";\n      proxy_set_header Host 127.0.0.1;\n\
         \x20     proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;\n\
         \x20     proxy_buffering off;\n      proxy_read_timeout 60s;\n\
         \x20     proxy_next_upstream error timeout;\n      proxy_next_upstream_tries 3;\n    }}\n  }}\n}}\n"
    )
}

impl Balancer {
    pub fn start(test: &str, backends: &[SocketAddr]) -> Option<Balancer> {
        let Some(bin) = nginx_bin() else {
            if std::env::var("TASKGATE_REQUIRE_PG").as_deref() == Ok("1") {
                panic!("{test}: nginx is required (TASKGATE_REQUIRE_PG=1) but not installed");
            }
            eprintln!("SKIPPED {test}: nginx is not installed");
            return None;
        };
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let conf = dir.path().join("nginx.conf");
        std::fs::write(&conf, nginx_conf(dir.path(), port, backends)).unwrap();
        let child = Command::new(bin)
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(&conf)
            .arg("-e")
            .arg(dir.path().join("error.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn nginx");
        let mut b = Balancer {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            child,
            dir,
        };
        b.wait_listening("nginx");
        Some(b)
    }

    /// HAProxy on 127.0.0.1, round-robin over `backends`, with a session sticking to the
    /// replica whose response carried its `Mcp-Session-Id` (`deploy/README.md`, "Routing").
    pub fn sticky(test: &str, backends: &[SocketAddr]) -> Option<Balancer> {
        let Some(bin) = [
            "/usr/sbin/haproxy",
            "/usr/bin/haproxy",
            "/usr/local/sbin/haproxy",
        ]
        .iter()
        .map(std::path::PathBuf::from)
        .find(|p| p.exists()) else {
            if std::env::var("TASKGATE_REQUIRE_PG").as_deref() == Ok("1") {
                panic!("{test}: haproxy is required (TASKGATE_REQUIRE_PG=1) but not installed");
            }
            eprintln!("SKIPPED {test}: haproxy is not installed (apt-get install haproxy)");
            return None;
        };
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let servers: String = backends
            .iter()
            .enumerate()
            .map(|(i, b)| format!("    server r{i} {b}\n"))
            .collect();
        let conf = dir.path().join("haproxy.cfg");
        std::fs::write(
            &conf,
            format!(
                "global\n    maxconn 4096\n\
                 defaults\n    mode http\n    timeout connect 5s\n    timeout client 60s\n\
                 \x20   timeout server 60s\n\
                 frontend mcp\n    bind 127.0.0.1:{port}\n    default_backend taskgate\n\
                 backend taskgate\n    balance roundrobin\n\
                 \x20   stick-table type string len 128 size 1m expire 1h\n\
                 \x20   stick on req.hdr(mcp-session-id)\n\
                 \x20   stick store-response res.hdr(mcp-session-id)\n{servers}"
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.path().join("error.log")).unwrap();
        let child = Command::new(bin)
            .arg("-db")
            .arg("-f")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn haproxy");
        let mut b = Balancer {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            child,
            dir,
        };
        b.wait_listening("haproxy");
        Some(b)
    }

    fn wait_listening(&mut self, name: &str) {
        let until = Instant::now() + STEP;
        while std::net::TcpStream::connect(self.addr).is_err() {
            if let Ok(Some(s)) = self.child.try_wait() {
                let log =
                    std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default();
                panic!("{name} exited ({s}): {log}");
            }
            assert!(
                Instant::now() < until,
                "{name} did not listen within {STEP:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `http://127.0.0.1:PORT/mcp`.
    pub fn mcp_url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        // SIGQUIT would wait for connections; the test is over: SIGTERM is a fast shutdown.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
