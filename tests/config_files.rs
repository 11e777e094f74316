//! Every shipped config file passes `taskgate check-config`, and a broken one fails naming the key.

use std::process::Command;

fn check_config(path: &str, envs: &[(&str, &str)]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_taskgate"))
        .arg("check-config")
        .arg(path)
        .envs(envs.iter().copied())
        .output()
        .expect("run taskgate");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn shipped_configs_are_valid() {
    let root = env!("CARGO_MANIFEST_DIR");
    let envs = [("TASKGATE_CI_TOKEN", "ci-token"), ("FILES_API_KEY", "k")];
    let mut files = vec![format!("{root}/config/taskgate.toml")];
    for entry in std::fs::read_dir(format!("{root}/config/examples")).unwrap() {
        files.push(entry.unwrap().path().display().to_string());
    }
    assert!(
        files.len() >= 4,
        "expected the default and the examples: {files:?}"
    );
    // `check-config` checks the store's directory on this machine (it can be made, or written
    // in): a deployment's `/var/lib/taskgate` is checked as a directory of the test's own.
    let dir = tempfile::tempdir().unwrap();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let here = dir
            .path()
            .join(std::path::Path::new(f).file_name().unwrap());
        let store = dir.path().join("store");
        std::fs::write(
            &here,
            text.replace("\"/var/lib/taskgate\"", &format!("{:?}", store)),
        )
        .unwrap();
        let (ok, text) = check_config(here.to_str().unwrap(), &envs);
        assert!(ok, "{f}: {text}");
        assert!(text.contains("valid"), "{f}: {text}");
    }
}

#[test]
fn example_needing_an_env_var_fails_without_it() {
    let root = env!("CARGO_MANIFEST_DIR");
    let (ok, text) = check_config(&format!("{root}/config/examples/bearer-auth.toml"), &[]);
    assert!(!ok);
    assert!(text.contains("TASKGATE_CI_TOKEN"), "{text}");
}

#[test]
fn misspelt_key_in_an_example_is_named_with_its_line() {
    let root = env!("CARGO_MANIFEST_DIR");
    let text = std::fs::read_to_string(format!("{root}/config/examples/sidecar.toml")).unwrap();
    let broken = text.replace("drain_timeout_ms", "drain_timeout_msec");
    let line = broken
        .lines()
        .position(|l| l.contains("drain_timeout_msec"))
        .unwrap()
        + 1;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broken.toml");
    std::fs::write(&path, broken).unwrap();
    let (ok, text) = check_config(path.to_str().unwrap(), &[]);
    assert!(!ok);
    assert!(text.contains("drain_timeout_msec"), "{text}");
    assert!(text.contains(&format!("line {line}")), "{text}");
}

/// A minimal valid config with `line` added under `section` (a new header unless the section is
/// `gateway` or `upstream`, which the base already has).
fn config_with(section: &str, line: &str) -> String {
    let base = "[gateway]\nlisten = \"127.0.0.1:0\"\n\n[[upstream]]\nname = \"a\"\nurl = \"http://127.0.0.1:1/mcp\"\n";
    match section {
        "gateway" => base.replacen("[gateway]\n", &format!("[gateway]\n{line}\n"), 1),
        "upstream" => format!("{base}{line}\n"),
        s => format!("{base}\n[{s}]\n{line}\n"),
    }
}

/// Numbers that make no sense (zero pages, zero live tasks, zero-length windows, intervals and
/// timeouts, page sizes beyond 1000) are refused at load, naming the key and its line; the
/// bounds themselves are accepted. `release_quiet_ms = 0` used to be accepted and made the
/// release tracker spin.
#[test]
fn out_of_range_numbers_are_refused_naming_key_and_line() {
    // (section, assignment, refused)
    let cases: &[(&str, &str, bool)] = &[
        ("tasks", "release_quiet_ms = 0", true),
        ("tasks", "release_quiet_ms = 1", false),
        ("tasks", "max_live_tasks_per_owner = 0", true),
        ("tasks", "list_page_size = 0", true),
        ("tasks", "list_page_size = 1001", true),
        ("tasks", "list_page_size = 1000", false),
        ("tasks", "max_ttl_ms = 0", true),
        ("tasks", "sweep_interval_ms = 0", true),
        ("gateway", "max_body_bytes = 0", true),
        ("gateway", "drain_timeout_ms = 0", true),
        ("gateway", "sse_keepalive_ms = 0", true),
        ("gateway", "max_connections = 0", true),
        ("gateway", "request_timeout_ms = 0", true),
        ("store", "cache_capacity_bytes = 0", true),
        ("upgrade", "ttl_ms = 0", true),
        ("upgrade", "disconnect_grace_ms = 0", false),
        ("upstream", "timeout_ms = 0", true),
        ("upstream", "connect_timeout_ms = 0", true),
    ];
    let dir = tempfile::tempdir().unwrap();
    let mut wrong = Vec::new();
    for (i, &(section, assignment, refused)) in cases.iter().enumerate() {
        let text = config_with(section, assignment);
        let line = text.lines().position(|l| l == assignment).unwrap() + 1;
        let field = assignment.split(' ').next().unwrap();
        let key = match section {
            "upstream" => format!("upstream[0].{field}"),
            s => format!("{s}.{field}"),
        };
        let path = dir.path().join(format!("case{i}.toml"));
        std::fs::write(&path, &text).unwrap();
        let (ok, out) = check_config(path.to_str().unwrap(), &[]);
        let right = if refused {
            !ok && out.contains(&format!("`{key}`")) && out.contains(&format!("line {line}"))
        } else {
            ok
        };
        if !right {
            wrong.push(format!(
                "[{section}] {assignment} (line {line}): ok={ok}: {out}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// `check-config` says what `serve` would find of a sled store's directory, and leaves nothing
/// behind: a path that cannot be created fails it (tester 3 F10: "valid", then `serve` exited
/// "cannot open the task store"); one that can is made and removed again.
#[test]
fn check_config_checks_the_store_directory_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    let a_file = dir.path().join("plain-file");
    std::fs::write(&a_file, b"").unwrap();
    let with_path = |path: &std::path::Path| {
        std::fs::write(
            &file,
            format!(
                "{}\n[store]\npath = {:?}\n",
                config_with("gateway", ""),
                path
            ),
        )
        .unwrap();
        check_config(file.to_str().unwrap(), &[])
    };
    let (ok, text) = with_path(&a_file.join("store"));
    assert!(!ok, "{text}");
    assert!(
        text.contains("store.path") && text.contains("cannot be created"),
        "{text}"
    );
    let (ok, text) = with_path(&a_file);
    assert!(!ok && text.contains("not a directory"), "{text}");
    let fresh = dir.path().join("a/b/store");
    let (ok, text) = with_path(&fresh);
    assert!(ok, "{text}");
    assert!(
        !dir.path().join("a").exists(),
        "the check left {fresh:?} behind"
    );
    std::fs::create_dir_all(&fresh).unwrap();
    let (ok, text) = with_path(&fresh);
    assert!(ok && text.contains("writable"), "{text}");
    assert_eq!(
        std::fs::read_dir(&fresh).unwrap().count(),
        0,
        "nothing left in the store"
    );
}
