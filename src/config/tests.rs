//! Loading and validating configurations.

use super::*;

const MINIMAL: &str = "[gateway]\nlisten = \"127.0.0.1:0\"\n[[upstream]]\nname = \"a\"\nurl = \"http://127.0.0.1:1/mcp\"\n";

/// Every `[gateway]` key has a default (config/REFERENCE.md), so a file without the section is
/// one with the defaults, as for every other section. It was refused with "missing field
/// `gateway`" pointing at line 1, column 1.
#[test]
fn a_file_without_a_gateway_section_has_its_defaults() {
    let c = Config::from_toml_str("[[upstream]]\nname = \"a\"\nurl = \"http://127.0.0.1:1/mcp\"\n")
        .unwrap();
    assert_eq!(c.gateway.listen.to_string(), "127.0.0.1:8080");
    assert_eq!(c.gateway.max_body_bytes, 4 * 1024 * 1024);
}

#[test]
fn embedded_default_is_valid() {
    let c = Config::embedded_default();
    assert_eq!(c.upstream[0].name, "default");
    assert_eq!(c.gateway.max_body_bytes, 4 * 1024 * 1024);
}

#[test]
fn unknown_key_is_named_with_its_line() {
    let text = format!("{MINIMAL}bogus = 1\n");
    let err = Config::from_toml_str(&text).unwrap_err().to_string();
    assert!(err.contains("bogus"), "{err}");
    assert!(err.contains("line 6"), "{err}");
}

#[test]
fn env_expansion_and_missing_variable() {
    std::env::set_var("TASKGATE_TEST_TOKEN_X", "s3cret");
    assert_eq!(
        expand_env("Bearer ${TASKGATE_TEST_TOKEN_X}").unwrap(),
        "Bearer s3cret"
    );
    assert_eq!(expand_env("a$$b").unwrap(), "a$b");
    let text = format!("{MINIMAL}headers = {{ X-Key = \"${{TASKGATE_TEST_UNSET_Y}}\" }}\n");
    let err = Config::from_toml_str(&text).unwrap_err().to_string();
    assert!(err.contains("TASKGATE_TEST_UNSET_Y"), "{err}");
}

/// A `${` without its `}` and an empty `${}` are named as what they are, and the value (which
/// may hold a secret) is not quoted (tester 3 F11: "uses ${unterminated ${ in \"…\"}, but
/// environment variable unterminated ${ in \"…\" is not set").
#[test]
fn env_expansion_syntax_errors_say_what_is_wrong() {
    assert_eq!(expand_env("a${b"), Err(EnvError::Unterminated));
    assert_eq!(expand_env("${}"), Err(EnvError::EmptyName));
    let err = |value: &str| {
        let text = format!("{MINIMAL}headers = {{ X-Key = \"{value}\" }}\n");
        Config::from_toml_str(&text).unwrap_err().to_string()
    };
    let e = err("secret9${X");
    assert!(
        e.contains("header \"X-Key\" has a `${` without its `}`"),
        "{e}"
    );
    assert!(!e.contains("secret9") && !e.contains("is not set"), "{e}");
    let e = err("${}");
    assert!(e.contains("a variable name is missing"), "{e}");
}

#[test]
fn upgrade_section() {
    let text = format!("{MINIMAL}[upgrade]\nenabled = true\non_client_disconnect = \"keep\"\n");
    let c = Config::from_toml_str(&text).unwrap();
    assert!(c.upgrade.enabled);
    assert_eq!(c.upgrade.on_client_disconnect, OnDisconnect::Keep);
    assert_eq!(c.upgrade.ttl_ms, 600_000);
    let text = format!("{MINIMAL}[upgrade]\non_client_disconnect = \"maybe\"\n");
    let err = Config::from_toml_str(&text).unwrap_err().to_string();
    assert!(err.contains("maybe"), "{err}");
}

/// The field names serde expects in a section, read from its unknown-field error.
fn fields_of(section_header: &str) -> Vec<String> {
    let text = format!("{section_header}\nzz_not_a_key = 1\n");
    let err = toml::from_str::<Config>(&text).unwrap_err().to_string();
    let expected = err
        .split("expected one of ")
        .nth(1)
        .or_else(|| err.split("expected ").nth(1))
        .unwrap_or_else(|| panic!("no field list in: {err}"));
    expected
        .split('`')
        .enumerate()
        .filter(|(i, _)| i % 2 == 1)
        .map(|(_, f)| f.to_string())
        .collect()
}

#[test]
fn reference_lists_every_key() {
    let reference = include_str!("../../config/REFERENCE.md");
    let readme = include_str!("../../README.md");
    let mut keys = Vec::new();
    for section in fields_of("") {
        let header = match section.as_str() {
            "upstream" => "[[upstream]]".to_string(),
            s => format!("[{s}]"),
        };
        for field in fields_of(&header) {
            keys.push(format!("{section}.{field}"));
        }
    }
    for field in fields_of("[[auth.token]]") {
        keys.push(format!("auth.token.{field}"));
    }
    for field in fields_of("[auth.oauth]") {
        keys.push(format!("auth.oauth.{field}"));
    }
    assert!(keys.len() > 20, "too few keys found: {keys:?}");
    assert!(
        readme.contains("config/REFERENCE.md"),
        "README.md must link the reference"
    );
    for key in &keys {
        assert!(
            reference.contains(&format!("`{key}`")),
            "config/REFERENCE.md does not document `{key}`"
        );
    }
    // And the other way: every documented key exists.
    for line in reference.lines().filter(|l| l.starts_with("| `")) {
        let key = line.split('`').nth(1).unwrap();
        assert!(
            keys.iter().any(|k| k == key)
                || ["auth.token", "auth.oauth", "upstream"].contains(&key),
            "config/REFERENCE.md documents `{key}`, which the config does not have"
        );
    }
}

#[test]
fn out_of_range_value_names_its_key_and_line() {
    let text = format!(
        "{MINIMAL}[tasks]\nlist_page_size = 10\n[[upstream]]\nname = \"b\"\nurl = \"http://127.0.0.1:2/mcp\"\ntimeout_ms = 0\n"
    );
    let err = Config::from_toml_str(&text).unwrap_err().to_string();
    assert!(
        err.contains("`upstream[1].timeout_ms` = 0 (line 11)"),
        "{err}"
    );
    let text = format!("{MINIMAL}[tasks]\nrelease_quiet_ms = 0 # spin\n");
    let err = Config::from_toml_str(&text).unwrap_err().to_string();
    assert!(
        err.contains("`tasks.release_quiet_ms` = 0 (line 7)"),
        "{err}"
    );
    // A key not written as `key = value` under its header is still named, without a line.
    let text = format!("{MINIMAL}[tasks]\n\"list_page_size\" = 1001\n");
    let err = Config::from_toml_str(&text).unwrap_err().to_string();
    assert!(err.contains("`tasks.list_page_size` = 1001"), "{err}");
}

#[test]
fn upstream_url_must_be_http() {
    let text = MINIMAL.replace("http://127.0.0.1:1/mcp", "ftp://x/mcp");
    assert!(Config::from_toml_str(&text).is_err());
}

#[test]
fn oauth_and_limits_sections_are_checked() {
    let auth = |extra: &str| {
        format!("{MINIMAL}[auth]\nmode = \"oauth\"\n[auth.oauth]\naudience = \"https://mcp.example.com/mcp\"\n{extra}")
    };
    let ok = Config::from_toml_str(&auth("issuer = \"http://127.0.0.1:9000\"\n")).unwrap();
    assert_eq!(ok.auth.oauth.unwrap().principal_claim, "sub");
    let refused = [
        (auth("issuer = \"http://idp.example.com\"\n"), "https://"),
        (
            auth("issuer = \"https://idp.example.com\"\nalgorithms = [\"HS256\"]\n"),
            "HS256",
        ),
        (auth("issuer = \"https://idp.example.com#x\"\n"), "fragment"),
        (
            auth("issuer = \"https://idp.example.com\"\nleeway_s = 301\n"),
            "leeway_s",
        ),
        (
            format!("{MINIMAL}[auth]\nmode = \"oauth\"\n"),
            "[auth.oauth]",
        ),
        // Issue 29 #18: a key-set fetch per request is no refresh policy.
        (
            auth("issuer = \"https://idp.example.com\"\njwks_min_refresh_ms = 1\n"),
            "jwks_min_refresh_ms",
        ),
        (
            auth("issuer = \"https://idp.example.com\"\ntoken_types = []\n"),
            "token_types",
        ),
        (
            format!("{MINIMAL}[limits]\nburst = 3\n"),
            "requests_per_second",
        ),
        (
            format!("{MINIMAL}[limits]\nmax_in_flight = 0\n"),
            "limits.max_in_flight",
        ),
        (
            format!("{MINIMAL}principal_header = \"bad header\"\n"),
            "principal_header",
        ),
    ];
    for (text, says) in refused {
        let err = Config::from_toml_str(&text).unwrap_err().to_string();
        assert!(err.contains(says), "{says}: {err}");
    }
}

/// Issue 16 item 7: values that validate but cannot run (sled panics below a 256-byte cache) or
/// make taskgate useless are refused at load, naming the key and its line.
#[test]
fn values_that_cannot_run_are_refused_with_key_and_line() {
    let cases = [
        (
            "[store]\ncache_capacity_bytes = 0\n",
            "store.cache_capacity_bytes",
        ),
        (
            "[store]\ncache_capacity_bytes = 255\n",
            "store.cache_capacity_bytes",
        ),
        ("[gateway]\nmax_body_bytes = 1\n", "gateway.max_body_bytes"),
        ("[upgrade]\nttl_ms = 1\n", "upgrade.ttl_ms"),
        (
            "[tasks]\nsweep_interval_ms = 5\n",
            "tasks.sweep_interval_ms",
        ),
        (
            "[gateway]\nsse_keepalive_ms = 1\n",
            "gateway.sse_keepalive_ms",
        ),
        (
            "[gateway]\nrequest_timeout_ms = 1\n",
            "gateway.request_timeout_ms",
        ),
    ];
    let upstream = "[[upstream]]\nname = \"a\"\nurl = \"http://127.0.0.1:1/mcp\"\n";
    for (section, key) in cases {
        let gateway = if section.starts_with("[gateway]") {
            ""
        } else {
            "[gateway]\n"
        };
        let text = format!("# a comment\n{section}{gateway}{upstream}");
        let err = Config::from_toml_str(&text).unwrap_err().to_string();
        assert!(err.contains(key), "{section}: {err}");
        assert!(err.contains("(line 3)"), "{section}: {err}");
    }
}

#[test]
fn store_backend_postgres_keys() {
    let with = |store: &str| format!("{MINIMAL}[store]\n{store}\n");
    let err = |store: &str| Config::from_toml_str(&with(store)).unwrap_err().to_string();
    // sled stays the default; the postgres keys are refused there.
    let c = Config::from_toml_str(MINIMAL).unwrap();
    assert_eq!(c.store.backend, StoreBackend::Sled);
    assert!(err("url = \"postgres://h/db\"").contains("backend = \"postgres\""));
    // postgres needs exactly one of url_env and url; a password never sits in the file.
    assert!(err("backend = \"postgres\"").contains("url_env"));
    let both = "backend = \"postgres\"\nurl = \"postgres://h/db\"\nurl_env = \"X\"";
    assert!(err(both).contains("not both"));
    for url in ["postgres://u:pw@h/db", "host=h user=u password=pw"] {
        let e = err(&format!("backend = \"postgres\"\nurl = \"{url}\""));
        assert!(e.contains("password") && !e.contains("pw@"), "{e}");
    }
    assert!(
        err("backend = \"postgres\"\nurl_env = \"TASKGATE_TEST_UNSET_DB\"")
            .contains("TASKGATE_TEST_UNSET_DB")
    );
    std::env::set_var("TASKGATE_TEST_DB_URL_Z", "postgres://u:pw@h/db");
    let c = Config::from_toml_str(&with(
        "backend = \"postgres\"\nurl_env = \"TASKGATE_TEST_DB_URL_Z\"\npool_size = 4",
    ))
    .unwrap();
    assert_eq!(
        c.store.database_url().as_deref(),
        Some("postgres://u:pw@h/db")
    );
    assert_eq!(c.store.pool_size, 4);
    let c = Config::from_toml_str(&with("backend = \"postgres\"\nurl = \"postgres://u@h/db\""))
        .unwrap();
    assert_eq!(c.store.database_url().as_deref(), Some("postgres://u@h/db"));
    assert!(
        err("backend = \"postgres\"\nurl = \"postgres://u@h/db\"\npool_size = 0")
            .contains("store.pool_size")
    );
}

/// A stdio upstream (issue 31): `command` instead of `url`, its program found on `PATH` or as
/// an executable path (relative to `cwd`), `env` expanded, `process` and `max_in_flight`.
#[test]
fn command_upstreams() {
    let base = "[gateway]\nlisten = \"127.0.0.1:0\"\n[[upstream]]\nname = \"kid\"\n";
    std::env::set_var("TASKGATE_TEST_CHILD_KEY", "k1");
    let c = Config::from_toml_str(&format!(
        "{base}command = [\"sh\", \"-c\", \"exit 0\"]\nprocess = \"per_session\"\nmax_in_flight = 8\nenv = {{ KEY = \"${{TASKGATE_TEST_CHILD_KEY}}\" }}\n"
    ))
    .unwrap();
    let up = &c.upstream[0];
    assert_eq!(up.process, ProcessMode::PerSession);
    assert_eq!(up.max_in_flight, 8);
    assert_eq!(up.env.get("KEY").map(String::as_str), Some("k1"));
    let shared = Config::from_toml_str(&format!("{base}command = [\"sh\"]\n")).unwrap();
    assert_eq!(shared.upstream[0].process, ProcessMode::Shared);
    // Tester 3 F21: a start-up budget apart from `timeout_ms` (default 60 s), in range.
    assert_eq!(shared.upstream[0].startup_timeout_ms, 60_000);
    let slow = Config::from_toml_str(&format!(
        "{base}command = [\"sh\"]\nstartup_timeout_ms = 120000\n"
    ))
    .unwrap();
    assert_eq!(slow.upstream[0].startup_timeout_ms, 120_000);
    let zero = Config::from_toml_str(&format!(
        "{base}command = [\"sh\"]\nstartup_timeout_ms = 0\n"
    ))
    .unwrap_err()
    .to_string();
    assert!(zero.contains("startup_timeout_ms"), "{zero}");

    let err = |extra: &str| {
        Config::from_toml_str(&format!("{base}{extra}"))
            .unwrap_err()
            .to_string()
    };
    let missing = err("command = [\"no-such-program-taskgate-test\"]\n");
    assert!(missing.contains("not found on PATH"), "{missing}");
    let plain = std::env::temp_dir().join(format!("taskgate-not-exec-{}", std::process::id()));
    std::fs::write(&plain, "not a program").unwrap();
    let not_exec = err(&format!("command = [{:?}]\n", plain.display().to_string()));
    let _ = std::fs::remove_file(&plain);
    assert!(not_exec.contains("not an executable"), "{not_exec}");
    let both = err("url = \"http://127.0.0.1:1/mcp\"\ncommand = [\"sh\"]\n");
    assert!(both.contains("not both"), "{both}");
    assert!(err("command = []\n").contains("must name a program"));
    let unset = err("command = [\"sh\"]\nenv = { K = \"${TASKGATE_TEST_UNSET_CHILD}\" }\n");
    assert!(unset.contains("TASKGATE_TEST_UNSET_CHILD"), "{unset}");
    assert!(err("command = [\"sh\"]\ncwd = \"/no/such/dir\"\n").contains("not a directory"));
    assert!(err("command = [\"sh\"]\nmax_in_flight = 0\n").contains("max_in_flight"));
    // A relative path is the child's, against its cwd.
    let relative = Config::from_toml_str(&format!("{base}command = [\"./sh\"]\ncwd = \"/bin\"\n"));
    assert!(relative.is_ok(), "{relative:?}");
}

/// `upstream.tasks` (issue 32): `"upstream"` by default, `"gateway"` accepted, anything else
/// refused naming the value and the two that exist.
#[test]
fn upstream_tasks_ownership() {
    let c = Config::from_toml_str(MINIMAL).unwrap();
    assert_eq!(c.upstream[0].tasks, TaskOwnership::Upstream);
    let c = Config::from_toml_str(&format!("{MINIMAL}tasks = \"gateway\"\n")).unwrap();
    assert_eq!(c.upstream[0].tasks, TaskOwnership::Gateway);
    let err = Config::from_toml_str(&format!("{MINIMAL}tasks = \"both\"\n"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("both") && err.contains("gateway") && err.contains("line 6"),
        "{err}"
    );
    // A gateway task's result lives only in its record: none kept is refused, saying so.
    let none_kept = format!("[tasks]\nmax_stored_result_bytes = 0\n{MINIMAL}tasks = \"gateway\"\n");
    let err = Config::from_toml_str(&none_kept).unwrap_err().to_string();
    assert!(err.contains("max_stored_result_bytes = 0"), "{err}");
}

/// `upstream.ca_roots` and the client certificate keys: `"mozilla"` accepted (alone or beside
/// a `ca_file`), another value refused naming the two; each refused beside an `http://` url or
/// a `command` naming the key; a client certificate without its key (and the other way) refused
/// saying what is missing; a pair that loads accepted.
#[test]
fn ca_roots_and_client_certificates_are_checked() {
    let upstream = |lines: &str| format!("[[upstream]]\nname = \"a\"\n{lines}\n");
    let ok = |lines: &str| Config::from_toml_str(&upstream(lines));
    let err = |lines: &str| ok(lines).unwrap_err().to_string();
    let fx = |f: &str| format!("{}/tests/fixtures/tls/{f}", env!("CARGO_MANIFEST_DIR"));
    let (ca, cert, key) = (fx("ca.pem"), fx("client.pem"), fx("client.key"));
    let https = "url = \"https://127.0.0.1:8443/mcp\"\n";
    let c = ok(&format!("{https}ca_roots = \"mozilla\"\nca_file = {ca:?}")).unwrap();
    assert_eq!(c.upstream[0].ca_roots, Some(crate::tls::CaRoots::Mozilla));
    let e = err(&format!("{https}ca_roots = \"os\""));
    assert!(
        e.contains("os") && e.contains("mozilla") && e.contains("system"),
        "{e}"
    );
    for (set, key_named) in [
        ("ca_roots = \"system\"".to_string(), "ca_roots"),
        (
            format!("client_cert_file = {cert:?}\nclient_key_file = {key:?}"),
            "client_cert_file",
        ),
    ] {
        let e = err(&format!("url = \"http://127.0.0.1:1/mcp\"\n{set}"));
        assert!(
            e.contains(&format!("{key_named} is for an https:// url")),
            "{e}"
        );
        let e = err(&format!("command = [\"sh\"]\n{set}"));
        assert!(
            e.contains(&format!("{key_named} is for an https:// url")),
            "{e}"
        );
    }
    let e = err(&format!("{https}client_cert_file = {cert:?}"));
    assert!(e.contains("client_cert_file needs client_key_file"), "{e}");
    let e = err(&format!("{https}client_key_file = {key:?}"));
    assert!(e.contains("client_key_file needs client_cert_file"), "{e}");
    let e = err(&format!(
        "{https}client_cert_file = {cert:?}\nclient_key_file = {cert:?}"
    ));
    assert!(
        e.contains("upstream[0].client_key_file") && e.contains("no PEM private key"),
        "{e}"
    );
    ok(&format!(
        "{https}client_cert_file = {cert:?}\nclient_key_file = {key:?}"
    ))
    .unwrap();
    // The store's: postgres only.
    let e = Config::from_toml_str(&format!(
        "[store]\nca_roots = \"system\"\n{}",
        upstream(https)
    ))
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("store.ca_roots is for backend = \"postgres\""),
        "{e}"
    );
    // The store's client certificate: postgres only, and with its key.
    let store =
        |lines: &str| Config::from_toml_str(&format!("[store]\n{lines}\n{}", upstream(https)));
    let e = store(&format!(
        "client_cert_file = {cert:?}\nclient_key_file = {key:?}"
    ))
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("store.client_cert_file / store.client_key_file are for backend = \"postgres\""),
        "{e}"
    );
    let pg = "backend = \"postgres\"\nurl = \"postgres://tg@db/tasks?sslmode=require\"";
    let e = store(&format!("{pg}\nclient_cert_file = {cert:?}"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("store.client_cert_file needs store.client_key_file"),
        "{e}"
    );
    let e = store(&format!("{pg}\nclient_key_file = {key:?}"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("store.client_key_file needs store.client_cert_file"),
        "{e}"
    );
    let both = store(&format!(
        "{pg}\nclient_cert_file = {cert:?}\nclient_key_file = {key:?}"
    ))
    .unwrap();
    assert!(both.store.tls().client_auth.is_some());
}

/// `upstream.proxy`: an `http://host:port` URL (with credentials, `${VAR}` expanded) accepted
/// for `http://` and `https://` upstreams; an unusable one, an unset variable and a proxy beside
/// a `command` refused, never quoting the value (it may hold a password).
#[test]
fn upstream_proxy_is_checked() {
    let upstream = |lines: &str| format!("[[upstream]]\nname = \"a\"\n{lines}\n");
    let ok = |lines: &str| Config::from_toml_str(&upstream(lines));
    let err = |lines: &str| ok(lines).unwrap_err().to_string();
    for url in ["https://mcp.example.com/mcp", "http://10.0.0.5:8000/mcp"] {
        let c = ok(&format!(
            "url = {url:?}\nproxy = \"http://proxy.corp:3128\""
        ))
        .unwrap();
        assert_eq!(
            c.upstream[0].proxy.as_deref(),
            Some("http://proxy.corp:3128")
        );
    }
    std::env::set_var("TASKGATE_TEST_PROXY_PASSWORD", "s3cret");
    let c =
        ok("url = \"https://h/mcp\"\nproxy = \"http://u:${TASKGATE_TEST_PROXY_PASSWORD}@p:3128\"")
            .unwrap();
    assert_eq!(
        c.upstream[0].proxy.as_deref(),
        Some("http://u:s3cret@p:3128")
    );
    let e =
        err("url = \"https://h/mcp\"\nproxy = \"http://u:${TASKGATE_TEST_UNSET_PROXY}@p:3128\"");
    assert!(
        e.contains("TASKGATE_TEST_UNSET_PROXY") && e.contains("proxy"),
        "{e}"
    );
    let e = err("url = \"https://h/mcp\"\nproxy = \"https://u:hidden@p:3128\"");
    assert!(
        e.contains("upstream \"a\": proxy https://") && !e.contains("hidden"),
        "{e}"
    );
    let e = err("url = \"https://h/mcp\"\nproxy = \"http://u:hidden@p\"");
    assert!(e.contains("host and port") && !e.contains("hidden"), "{e}");
    let e = err("command = [\"sh\"]\nproxy = \"http://p:3128\"");
    assert!(e.contains("proxy is for a url upstream"), "{e}");
}

/// `https://` upstreams: accepted with the Mozilla roots or a `ca_file` that holds CA
/// certificates; `ca_file` beside an `http://` url, a file without certificates and a host no
/// certificate can name are refused naming what is wrong. The scheme decides the default port.
#[test]
fn https_upstreams_and_their_ca_file() {
    let upstream = |lines: &str| format!("[[upstream]]\nname = \"a\"\n{lines}\n");
    let ok = |lines: &str| Config::from_toml_str(&upstream(lines)).map(|_| ());
    let err = |lines: &str| ok(lines).unwrap_err().to_string();
    let ca = format!("{}/tests/fixtures/tls/ca.pem", env!("CARGO_MANIFEST_DIR"));
    ok("url = \"https://mcp.example.com/mcp\"").unwrap();
    ok(&format!(
        "url = \"https://127.0.0.1:8443/mcp\"\nca_file = {ca:?}"
    ))
    .unwrap();
    ok("url = \"https://[::1]:8443/mcp\"").unwrap();
    let e = err(&format!(
        "url = \"http://127.0.0.1:1/mcp\"\nca_file = {ca:?}"
    ));
    assert!(e.contains("ca_file is for an https:// url"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "no certificate here\n").unwrap();
    let e = err(&format!("url = \"https://h/mcp\"\nca_file = {empty:?}"));
    assert!(
        e.contains("upstream[0].ca_file") && e.contains("no PEM certificate"),
        "{e}"
    );
    // A stdio upstream has no TLS: its ca_file would be silently unused (found by the cold
    // review).
    let e = err(&format!("command = [\"sh\"]\nca_file = {ca:?}"));
    assert!(e.contains("ca_file is for an https:// url"), "{e}");
    let e = err("url = \"ftp://h/mcp\"");
    assert!(
        e.contains("must be http://host[:port]/path or https://"),
        "{e}"
    );
    // Credentials in the url would go up in `Host` and be printed: refused, the password not
    // quoted back.
    for url in ["http://u:secret@127.0.0.1:1/mcp", "https://u:secret@h/mcp"] {
        let e = err(&format!("url = {url:?}"));
        assert!(
            e.contains("credentials") && e.contains("***@") && !e.contains("secret"),
            "{e}"
        );
    }
    let e = err("url = \"http://127.0.0.1:0/mcp\"");
    assert!(e.contains("port 0"), "{e}");
    // Headers taskgate sets itself are refused; `Host` may be set (a virtual host).
    for name in [
        "Content-Length",
        "transfer-encoding",
        "Connection",
        "Mcp-Session-Id",
    ] {
        let e = err(&format!(
            "url = \"http://127.0.0.1:1/mcp\"\n[upstream.headers]\n{name:?} = \"1\""
        ));
        assert!(e.contains("set by taskgate itself"), "{name}: {e}");
    }
    ok("url = \"http://127.0.0.1:1/mcp\"\n[upstream.headers]\nHost = \"mcp.internal\"").unwrap();
    // Nor in the errors of a url refused for something else (its scheme, its syntax).
    for url in [
        "ftp://u:secret@h/mcp",
        "http://u:secret@h:99999999/mcp",
        "http://u:secret@h:1/m cp",
    ] {
        let e = err(&format!("url = {url:?}"));
        assert!(e.contains("url") && !e.contains("secret"), "{e}");
    }
    let uri = |u: &str| u.parse::<http::Uri>().unwrap();
    assert_eq!(upstream_authority(&uri("https://h/mcp")), "h:443");
    assert_eq!(upstream_authority(&uri("http://h/mcp")), "h:80");
    assert_eq!(
        upstream_authority(&uri("https://[::1]:8443/mcp")),
        "[::1]:8443"
    );
    assert_eq!(upstream_host(&uri("https://[::1]:8443/mcp")), "::1");
}

/// `{:?}` of a config never prints a secret (a tester found `upstream.proxy`'s password and
/// `upstream.headers`' `Authorization` in it): the proxy's and the store URL's credentials, the
/// values of `upstream.headers` and `upstream.env`, and a bearer token's hash are redacted;
/// names, hosts and the rest still show.
#[test]
fn debug_never_prints_secrets() {
    let text = r#"
[store]
backend = "postgres"
url = "postgres://tg:pgsecret1@db:5432/tg"
[auth]
mode = "bearer"
[[auth.token]]
principal = "alice"
sha256 = "hashsecret2"
[[upstream]]
name = "a"
url = "http://127.0.0.1:1/mcp"
proxy = "http://user:proxysecret3@proxy:3128"
[upstream.headers]
Authorization = "Bearer headersecret4"
[[upstream]]
name = "b"
command = ["server", "--api-key", "argsecret6"]
[upstream.env]
API_KEY = "envsecret5"
"#;
    // Not validated (a store URL with a password is refused there): `Debug` must not rely on it.
    let c: Config = toml::from_str(text).unwrap();
    for shown in [format!("{c:?}"), format!("{c:#?}")] {
        for secret in [
            "pgsecret1",
            "hashsecret2",
            "proxysecret3",
            "headersecret4",
            "envsecret5",
            "argsecret6",
        ] {
            assert!(!shown.contains(secret), "{secret} printed: {shown}");
        }
        for kept in [
            "Authorization",
            "API_KEY",
            "proxy:3128",
            "db:5432",
            "alice",
            "http://127.0.0.1:1/mcp",
            "\"server\"",
            "2 arguments redacted",
        ] {
            assert!(shown.contains(kept), "{kept} not shown: {shown}");
        }
    }
    // A proxy password taken from the environment, as validated configs hold it.
    std::env::set_var("TASKGATE_TEST_PROXY_PW", "proxysecret6");
    let text =
        format!("{MINIMAL}proxy = \"http://u:${{TASKGATE_TEST_PROXY_PW}}@127.0.0.1:3128\"\n");
    let c = Config::from_toml_str(&text).unwrap();
    assert_eq!(
        c.upstream[0].proxy.as_deref(),
        Some("http://u:proxysecret6@127.0.0.1:3128")
    );
    let shown = format!("{:?}", c.upstream[0]);
    assert!(!shown.contains("proxysecret6"), "{shown}");
}

/// `check-config` refuses what `serve` cannot bind: the admin listener on the gateway's port
/// (tester 3 F10: "valid", then serve exited "Address already in use").
#[test]
fn admin_and_gateway_cannot_share_a_port() {
    let with = |gateway: &str, admin: &str| {
        let text = format!(
            "[gateway]\nlisten = \"{gateway}\"\n[admin]\nlisten = \"{admin}\"\n\
             [[upstream]]\nname = \"a\"\nurl = \"http://127.0.0.1:1/mcp\"\n"
        );
        Config::from_toml_str(&text).map_err(|e| e.to_string())
    };
    for (g, a) in [
        ("127.0.0.1:4810", "127.0.0.1:4810"),
        ("0.0.0.0:4810", "127.0.0.1:4810"),
        ("127.0.0.1:4810", "[::]:4810"),
    ] {
        let err = with(g, a).unwrap_err();
        assert!(
            err.contains("admin.listen") && err.contains("gateway.listen"),
            "{err}"
        );
    }
    for (g, a) in [
        ("127.0.0.1:4810", "127.0.0.1:4811"),
        ("127.0.0.1:0", "127.0.0.1:0"),
        ("127.0.0.1:4810", "127.0.0.2:4810"),
    ] {
        assert!(with(g, a).is_ok(), "{g} {a}");
    }
}

/// A bearer token names one principal, and a principal is a name (tester 3 F16: an empty
/// principal and one hash under two principals were accepted); an upstream named only by dots
/// could not be reached at `/mcp/<name>` (F18).
#[test]
fn principals_and_upstream_names_are_usable() {
    let hash = "a".repeat(64);
    let tokens = |a: &str, b: &str| {
        format!(
            "{MINIMAL}[auth]\nmode = \"bearer\"\n\
             [[auth.token]]\nprincipal = \"{a}\"\nsha256 = \"{hash}\"\n\
             [[auth.token]]\nprincipal = \"{b}\"\nsha256 = \"{}\"\n",
            "b".repeat(64)
        )
    };
    assert!(Config::from_toml_str(&tokens("alice", "bob")).is_ok());
    for (a, b, what) in [
        ("", "bob", "principal"),
        ("al\\u0001", "bob", "principal"),
        ("  ", "bob", "principal"),
    ] {
        let err = Config::from_toml_str(&tokens(a, b))
            .unwrap_err()
            .to_string();
        assert!(err.contains(what), "{err}");
    }
    let twice = format!(
        "{MINIMAL}[auth]\nmode = \"bearer\"\n\
         [[auth.token]]\nprincipal = \"alice\"\nsha256 = \"{hash}\"\n\
         [[auth.token]]\nprincipal = \"bob\"\nsha256 = \"{}\"\n",
        hash.to_uppercase()
    );
    let err = Config::from_toml_str(&twice).unwrap_err().to_string();
    assert!(
        err.contains("auth.token[1].sha256 is auth.token[0]'s"),
        "{err}"
    );
    for name in [".", "..", "..."] {
        let text = MINIMAL.replace("name = \"a\"", &format!("name = \"{name}\""));
        let err = Config::from_toml_str(&text).unwrap_err().to_string();
        assert!(err.contains("not only dots"), "{err}");
    }
    let text = MINIMAL.replace("name = \"a\"", "name = \"a.b\"");
    assert!(Config::from_toml_str(&text).is_ok());
}

/// `gateway.trusted_proxies`: CIDRs or single addresses, IPv4 and IPv6; anything else is refused
/// at load, naming the key and the entry.
#[test]
fn trusted_proxies_are_cidrs_or_addresses() {
    let with = |list: &str| {
        MINIMAL.replace(
            "[gateway]\n",
            &format!("[gateway]\ntrusted_proxies = {list}\n"),
        )
    };
    let ok = Config::from_toml_str(&with(
        r#"["10.0.0.0/8", "fd00::/8", "192.0.2.7", "::1", "10.1.2.3/16"]"#,
    ))
    .unwrap();
    let nets: Vec<String> = ok
        .gateway
        .trusted_proxy_nets()
        .unwrap()
        .iter()
        .map(|n| n.to_string())
        .collect();
    assert_eq!(
        nets,
        [
            "10.0.0.0/8",
            "fd00::/8",
            "192.0.2.7/32",
            "::1/128",
            "10.1.0.0/16"
        ]
    );
    assert!(GatewayConfig::default()
        .trusted_proxy_nets()
        .unwrap()
        .is_empty());
    for bad in [
        r#"["10.0.0.0/33"]"#,
        r#"["nginx"]"#,
        r#"["10.0.0.0/8", ""]"#,
        r#"["fd00::/129"]"#,
    ] {
        let err = Config::from_toml_str(&with(bad)).unwrap_err().to_string();
        assert!(err.contains("gateway.trusted_proxies"), "{bad}: {err}");
    }
}
