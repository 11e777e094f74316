//! What the store shows of itself: a connection string without its secrets, and this
//! process's name in cancel claims.

use std::str::FromStr;

/// The driver's config of connection string `url`, or why not, in words an operator can act on.
/// `sslmode=verify-ca` / `verify-full` (libpq's) are refused here by name rather than as an
/// "invalid connection string": `sslmode=require` already verifies the certificate and the host
/// name (see `tls`).
pub(super) fn parse(url: &str) -> Result<tokio_postgres::Config, String> {
    tokio_postgres::Config::from_str(url).map_err(|e| {
        if url.contains("sslmode=verify-") || url.contains("sslmode = verify-") {
            "sslmode=verify-ca/verify-full: use sslmode=require, with which taskgate verifies the \
             server's certificate and host name (against store.ca_file, or the Mozilla roots)"
                .to_string()
        } else {
            format!("not a PostgreSQL URL: {e}")
        }
    })
}

/// What a message may show of a connection string: its user, hosts, ports and database, read
/// from the parsed config and written as a URL. Never the password, whatever form it was given
/// in (URL userinfo, a `password=` query parameter, a key/value `password = '…'`), and never the
/// other parameters; a string that does not parse is not echoed at all.
pub fn redact(url: &str) -> String {
    let Ok(config) = tokio_postgres::Config::from_str(url) else {
        return "(a connection string that does not parse)".into();
    };
    let ports = config.get_ports();
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, host)| {
            let name = match host {
                tokio_postgres::config::Host::Tcp(h) => h.clone(),
                tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
            };
            match ports.get(i).or(ports.first()) {
                Some(port) => format!("{name}:{port}"),
                None => name,
            }
        })
        .collect();
    let user = config
        .get_user()
        .map(|u| format!("{u}@"))
        .unwrap_or_default();
    let db = config.get_dbname().unwrap_or_default();
    format!("postgres://{user}{}/{db}", hosts.join(","))
}

pub(super) fn replica_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "host".into());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{host}:{}:{nanos:x}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::{parse, redact};

    /// A `sslmode` taskgate cannot honour is named in the error, never a bare parse failure.
    #[test]
    fn verify_sslmodes_are_refused_by_name() {
        for url in [
            "postgres://tg@db/tasks?sslmode=verify-full",
            "host=db user=tg sslmode=verify-ca",
        ] {
            let err = parse(url).unwrap_err();
            assert!(err.contains("use sslmode=require"), "{url}: {err}");
        }
        assert!(parse("postgres://tg@db/tasks?sslmode=require").is_ok());
        assert!(parse("postgres://tg@db/tasks?sslmode=nonsense")
            .unwrap_err()
            .starts_with("not a PostgreSQL URL"));
    }

    /// Messages name the database without its password, whatever form it was given in.
    #[test]
    fn redact_never_shows_the_password() {
        assert_eq!(
            redact("postgres://tg:s3cret@db:5432/tasks?sslmode=disable"),
            "postgres://tg@db:5432/tasks"
        );
        assert_eq!(
            redact("postgres://tg@db/tasks"),
            "postgres://tg@db:5432/tasks"
        );
        // Every other way of writing the password (found by review: these were printed as given).
        for url in [
            "host=db user=tg password=s3cret dbname=tasks",
            "host=db user=tg password = s3cret dbname=tasks",
            "host=db user=tg password='s3 cret' dbname=tasks",
            "postgresql://tg@db/tasks?password=s3cret",
            "postgresql://tg:s3cret@db/tasks?password=s3cret&application_name=x",
        ] {
            let shown = redact(url);
            assert!(!shown.contains("s3"), "{url} → {shown}");
            assert!(
                shown.starts_with("postgres://tg@db") && shown.ends_with("/tasks"),
                "{url} → {shown}"
            );
        }
        assert!(!redact("not a url password=s3cret").contains("s3cret"));
    }
}
