//! Tier 1, "core": taskgate's integration tests that need nothing but this machine, in one
//! crate (one harness compile, one link): taskgate in process on sled, scripted upstreams of
//! both eras, and a few runs of the real binary. `cargo test --lib --test core` is the loop a
//! developer runs; `tests/run-all.sh` runs every tier. Each module is one file of `tests/`,
//! named by the behaviour it pins.

mod common;

mod admin;
mod admin_auth;
mod bounds;
mod bridge;
mod bridge_held;
mod bridge_held_store;
mod bridge_listen;
mod bridge_mrtr;
mod bridge_reverse;
mod bridge_status;
mod cancel;
mod config_files;
mod edge_attacks;
mod edge_headers;
mod edge_rejections;
mod edge_sessions;
mod edge_transport;
mod fairness;
mod gateway_tasks;
mod hardening;
mod modern;
mod oauth;
mod registry;
mod request_ids;
mod routing;
mod stdio;
mod store_io_wakeups;
mod telemetry;
mod upgrade;
mod upstream_tls;

/// Every `tests/*.rs` file is a module of one tier's crate (`Cargo.toml` sets `autotests =
/// false`, so a file in neither would silently never run).
#[test]
fn every_test_file_is_in_a_tier() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let declared = |crate_file: &str| {
        std::fs::read_to_string(dir.join(crate_file))
            .unwrap()
            .lines()
            .filter_map(|l| {
                l.strip_prefix("mod ")?
                    .strip_suffix(';')
                    .map(str::to_string)
            })
            .collect::<Vec<_>>()
    };
    let (core, full) = (declared("core.rs"), declared("full.rs"));
    for entry in std::fs::read_dir(&dir).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        let Some(module) = name.strip_suffix(".rs") else {
            continue;
        };
        if module == "core" || module == "full" {
            continue;
        }
        assert!(
            core.iter().chain(&full).any(|m| m == module),
            "tests/{name} is in no tier: add `mod {module};` to tests/core.rs or tests/full.rs"
        );
    }
}
