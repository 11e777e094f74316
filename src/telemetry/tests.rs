use super::*;
use bytes::Bytes;
use std::collections::HashMap;

fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let vars: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| vars.get(k).cloned()
}

fn config(endpoint: Option<&str>, name: Option<&str>, ratio: Option<f64>) -> TelemetryConfig {
    TelemetryConfig {
        otlp_endpoint: endpoint.map(str::to_string),
        service_name: name.map(str::to_string),
        sample_ratio: ratio,
    }
}

#[test]
fn off_without_an_endpoint_anywhere() {
    assert_eq!(
        Settings::resolve(&config(None, Some("x"), Some(0.5)), env(&[])).unwrap(),
        None
    );
    assert_eq!(
        Settings::resolve(
            &config(Some("http://c:4318"), None, None),
            env(&[("OTEL_SDK_DISABLED", "true")])
        )
        .unwrap(),
        None
    );
}

#[test]
fn the_file_wins_over_the_variables_key_by_key() {
    let vars = env(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4318"),
        (
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://traces:4318/custom",
        ),
        ("OTEL_SERVICE_NAME", "from-env"),
        ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
        ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
    ]);
    let s = Settings::resolve(
        &config(Some("http://file:4318/"), Some("gw"), Some(0.5)),
        &vars,
    )
    .unwrap()
    .unwrap();
    assert_eq!(
        s,
        Settings {
            traces_endpoint: "http://file:4318/v1/traces".into(),
            service_name: "gw".into(),
            sample_ratio: 0.5
        }
    );
    let s = Settings::resolve(&config(None, None, None), &vars)
        .unwrap()
        .unwrap();
    assert_eq!(
        s,
        Settings {
            traces_endpoint: "http://traces:4318/custom".into(),
            service_name: "from-env".into(),
            sample_ratio: 0.25
        }
    );
    let s = Settings::resolve(
        &config(None, None, None),
        env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4318")]),
    )
    .unwrap()
    .unwrap();
    assert_eq!(s.traces_endpoint, "http://env:4318/v1/traces");
    assert_eq!((s.service_name.as_str(), s.sample_ratio), ("taskgate", 1.0));
}

#[test]
fn unusable_variables_are_refused_by_name() {
    for (vars, named) in [
        (
            vec![("OTEL_EXPORTER_OTLP_ENDPOINT", "c:4318")],
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        ),
        (
            vec![
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("OTEL_TRACES_SAMPLER", "jaeger_remote"),
            ],
            "OTEL_TRACES_SAMPLER",
        ),
        (
            vec![
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("OTEL_TRACES_SAMPLER", "traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", "2"),
            ],
            "OTEL_TRACES_SAMPLER_ARG",
        ),
    ] {
        let err = Settings::resolve(&config(None, None, None), env(&vars)).unwrap_err();
        assert!(err.to_string().contains(named), "{err}");
    }
}

fn msg(text: &str) -> Message {
    Message::parse_checked(Bytes::from(text.to_string())).unwrap()
}

const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

#[test]
fn the_meta_traceparent_is_spliced_and_every_other_byte_kept() {
    let cases = [
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","_meta":{"traceparent":"old", "progressToken":1.50}}}"#,
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"x","_meta":{{"traceparent":"{TP}", "progressToken":1.50}}}}}}"#
            ),
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","_meta":{ "progressToken":7}}}"#,
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"x","_meta":{{"traceparent":"{TP}", "progressToken":7}}}}}}"#
            ),
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}}"#,
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"_meta":{{"traceparent":"{TP}"}},"name":"x"}}}}"#
            ),
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
            format!(
                r#"{{"params":{{"_meta":{{"traceparent":"{TP}"}}}},"jsonrpc":"2.0","id":1,"method":"tools/list"}}"#
            ),
        ),
    ];
    for (input, want) in cases {
        let out = with_meta_traceparent(&msg(input), TP).expect(input);
        assert_eq!(std::str::from_utf8(out.bytes()).unwrap(), want);
    }
    // Not a request, or params that are not an object: left as they are.
    assert!(with_meta_traceparent(&msg(r#"{"jsonrpc":"2.0","id":1,"result":{}}"#), TP).is_none());
    assert!(with_meta_traceparent(
        &msg(r#"{"jsonrpc":"2.0","id":1,"method":"m","params":[1]}"#),
        TP
    )
    .is_none());
}

#[test]
fn error_type_names_the_code_or_a_tool_error() {
    assert_eq!(
        error_type(br#"{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"x"}}"#).as_deref(),
        Some("-32602")
    );
    assert_eq!(
        error_type(br#"{"jsonrpc":"2.0","id":1,"result":{"content":[],"isError":true}}"#)
            .as_deref(),
        Some("tool_error")
    );
    assert_eq!(
        error_type(br#"{"jsonrpc":"2.0","id":1,"result":{"isError":false}}"#),
        None
    );
}
