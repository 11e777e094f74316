//! `[telemetry]`: OpenTelemetry traces over OTLP/HTTP (issue 34). Unset, nothing is exported;
//! the `OTEL_*` variables that fill in what the file leaves out are read by
//! `crate::telemetry::Settings::resolve` (the precedence is documented in `config/REFERENCE.md`).

use super::ConfigError;
use serde::Deserialize;

/// `[telemetry]`: where traces go and how many are kept. Every key is optional.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetryConfig {
    /// The OTLP/HTTP (protobuf) collector's base URL, `http://host:port` or `https://…`; spans
    /// are posted to `<otlp_endpoint>/v1/traces`. Unset (and no `OTEL_EXPORTER_OTLP_*`
    /// endpoint variable): no export.
    pub otlp_endpoint: Option<String>,
    /// `service.name` of the exported resource (default `OTEL_SERVICE_NAME`, else `"taskgate"`).
    pub service_name: Option<String>,
    /// The ratio of the parent-based ratio sampler, 0.0 to 1.0 (default
    /// `OTEL_TRACES_SAMPLER`/`OTEL_TRACES_SAMPLER_ARG`, else 1.0).
    pub sample_ratio: Option<f64>,
}

impl TelemetryConfig {
    /// Checks the endpoint's shape (an `http` or `https` URL with a host) and the ratio's range.
    ///
    /// Errors: [`ConfigError::Invalid`] naming the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(endpoint) = &self.otlp_endpoint {
            check_endpoint("telemetry.otlp_endpoint", endpoint)?;
        }
        if let Some(name) = &self.service_name {
            if name.trim().is_empty() {
                return Err(ConfigError::Invalid(
                    "telemetry.service_name must not be empty".into(),
                ));
            }
        }
        if let Some(ratio) = self.sample_ratio {
            if !(0.0..=1.0).contains(&ratio) {
                return Err(ConfigError::Invalid(format!(
                    "telemetry.sample_ratio = {ratio}: must be between 0.0 and 1.0"
                )));
            }
        }
        Ok(())
    }
}

/// Checks that `value` (of `key`: a config key or an `OTEL_*` variable) is an `http://` or
/// `https://` URL with a host. Errors: [`ConfigError::Invalid`] naming `key`.
pub fn check_endpoint(key: &str, value: &str) -> Result<(), ConfigError> {
    // Checked before the parse, whose error would quote the value: a password would be logged.
    let authority = value.split_once("://").map_or(value, |(_, rest)| rest);
    let authority = authority.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.contains('@') {
        return Err(ConfigError::Invalid(format!(
            "{key} must not carry credentials (`user:password@`): they would not be sent; give the collector's credentials as a header field in OTEL_EXPORTER_OTLP_HEADERS (for instance `Authorization=Basic …`)"
        )));
    }
    let uri: http::Uri = value
        .parse()
        .map_err(|e| ConfigError::Invalid(format!("{key} {value:?}: {e}")))?;
    match (uri.scheme_str(), uri.authority()) {
        (Some("http" | "https"), Some(_)) => Ok(()),
        _ => Err(ConfigError::Invalid(format!(
            "{key} {value:?} must be an http:// or https:// URL with a host (OTLP/HTTP)"
        ))),
    }
}
