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
        "expected the default and three examples: {files:?}"
    );
    for f in &files {
        let (ok, text) = check_config(f, &envs);
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
