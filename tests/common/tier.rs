//! A tier of taskgate replicas (the real binary) sharing one PostgreSQL ([`Tier`]), behind nginx
//! round-robin ([`Balancer`]), in front of one upstream. Every process stops on drop.

use super::*;

/// One replica: its config (a fixed gateway port, so a restart comes back where nginx expects
/// it; the admin port is the system's pick each start: a fixed one freed by a kill can be taken
/// by another test's ephemeral bind before the restart, which happened under load).
pub struct Replica {
    pub config: String,
    pub gateway: SocketAddr,
    pub process: Option<TaskgateProcess>,
}

impl Replica {
    pub fn new(dir: &std::path::Path, n: usize, upstream: &str) -> Replica {
        Replica::with_auth(dir, n, upstream, "[auth]\nmode = \"none\"\n")
    }

    /// A replica whose `[auth]` section is `auth` (TOML).
    pub fn with_auth(dir: &std::path::Path, n: usize, upstream: &str, auth: &str) -> Replica {
        let gp = free_port();
        let toml = format!(
            "[gateway]\nlisten = \"127.0.0.1:{gp}\"\n\n[admin]\nlisten = \"127.0.0.1:0\"\n\n\
             [store]\nbackend = \"postgres\"\nurl_env = \"TASKGATE_DATABASE_URL\"\npool_size = 8\n\n\
             {auth}\n[upgrade]\nenabled = false\n\n\
             [[upstream]]\nname = \"default\"\nurl = \"{upstream}\"\n"
        );
        let config = dir.join(format!("replica{n}.toml"));
        std::fs::write(&config, toml).unwrap();
        Replica {
            config: config.to_str().unwrap().to_string(),
            gateway: SocketAddr::from(([127, 0, 0, 1], gp)),
            process: None,
        }
    }

    pub fn start(&mut self, db: &str) {
        let mut p = TaskgateProcess::spawn(
            &["serve", "--config", &self.config],
            &[("TASKGATE_DATABASE_URL", db), ("RUST_LOG", "warn")],
        );
        let (g, _) = p.listening();
        assert_eq!(g, self.gateway);
        self.process = Some(p);
    }

    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.gateway)
    }

    /// The admin listener's address (`/metrics`), from the listening line of the running process.
    pub fn admin(&self) -> Option<SocketAddr> {
        let line = self.process.as_ref()?.listening_line.as_deref()?;
        let v: serde_json::Value = serde_json::from_str(line).ok()?;
        v["listening"]["admin"].as_str()?.parse().ok()
    }
}

/// Three replicas on one PostgreSQL behind nginx.
pub struct Tier {
    pub replicas: Vec<Replica>,
    pub balancer: Balancer,
    pub pg: PgCluster,
    _dir: tempfile::TempDir,
}

impl Tier {
    /// `None` (printed) when PostgreSQL or nginx is missing and not required.
    pub fn start(test: &str, upstream: &str) -> Option<Tier> {
        Tier::start_with(test, upstream, "[auth]\nmode = \"none\"\n")
    }

    /// [`Tier::start`] with the replicas' `[auth]` section `auth` (TOML; [`bearer_auth`]), which
    /// may add other sections after it (`[tasks]`).
    pub fn start_with(test: &str, upstream: &str, auth: &str) -> Option<Tier> {
        let pg = PgCluster::start(test)?;
        let dir = tempfile::tempdir().unwrap();
        let mut replicas: Vec<Replica> = (0..3)
            .map(|n| Replica::with_auth(dir.path(), n, upstream, auth))
            .collect();
        for r in &mut replicas {
            r.start(&pg.url);
        }
        let backends: Vec<SocketAddr> = replicas.iter().map(|r| r.gateway).collect();
        let balancer = Balancer::start(test, &backends)?;
        Some(Tier {
            replicas,
            balancer,
            pg,
            _dir: dir,
        })
    }
}

/// An `[auth]` section of bearer tokens: `(principal, token)` pairs, each kept as its SHA-256.
pub fn bearer_auth(tokens: &[(&str, &str)]) -> String {
    let mut s = String::from("[auth]\nmode = \"bearer\"\n");
    for (p, t) in tokens {
        let h = hex::encode(Sha256::digest(t.as_bytes()));
        s.push_str(&format!(
            "\n[[auth.token]]\nprincipal = {p:?}\nsha256 = {h:?}\n"
        ));
    }
    s
}

/// taskgate in this process with its registry in the PostgreSQL at `url` (handed over in the
/// environment variable `env`, which the test names uniquely): a replica of a tier.
pub async fn tg_on_pg(config: &TgConfig, env: &str, url: &str) -> Tg {
    std::env::set_var(env, url);
    Tg::start(|store| {
        config.to_toml(store).replace(
            &format!("[store]\npath = {store:?}\n"),
            &format!("[store]\nbackend = \"postgres\"\nurl_env = {env:?}\npool_size = 4\n"),
        )
    })
    .await
}
