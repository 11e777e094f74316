//! Logs written to a file or a pipe carry no ANSI colour codes (issue 16, item 14).

use crate::common::*;

/// `taskgate serve --log-format text` with stderr on a pipe: plain text, no escape sequences.
#[test]
fn logs_to_a_pipe_carry_no_ansi_colour() {
    let dir = tempfile::tempdir().unwrap();
    let config = TgConfig::new(&dead_url()).write_for_binary(dir.path());
    let mut p = TaskgateProcess::spawn(
        &["serve", "--config", &config, "--log-format", "text"],
        &[("RUST_LOG", "info")],
    );
    p.listening();
    p.sigterm();
    assert!(p.wait_exit(STEP).is_some(), "taskgate stops on SIGTERM");
    let err = p.stderr();
    assert!(err.contains("taskgate listening"), "{err}");
    assert!(
        !err.contains('\u{1b}'),
        "ANSI escape in piped logs: {err:?}"
    );
}
