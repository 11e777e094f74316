//! OpenTelemetry traces (issue 34) against a test OTLP/HTTP receiver that decodes the export
//! bodies as real protobuf (`opentelemetry-proto`): the SERVER span of each request, its parent
//! from `params._meta.traceparent` or the HTTP header (a link when both differ), the CLIENT span
//! of each upstream exchange as the parent the upstream sees (header and `_meta`), the MCP
//! semantic-convention attributes, for a 2025-11-25 and a 2026-07-28 task lifecycle.

use crate::common::*;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;
use serde_json::{json, Value};

/// The client's own trace context (in `_meta`) and a proxy's (in the HTTP header).
const META_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const META_SPAN: &str = "00f067aa0ba902b7";
const HEADER_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const HEADER_SPAN: &str = "b7ad6b7169203331";

fn traceparent(trace: &str, span: &str) -> String {
    format!("00-{trace}-{span}-01")
}

/// A receiver of OTLP/HTTP exports: every POST is answered 200 and kept.
async fn receiver() -> Upstream {
    Upstream::start(|_| ScriptedResponse::status(200, Some("application/x-protobuf"), "")).await
}

/// Every span the receiver got (each body decoded as an `ExportTraceServiceRequest`), with the
/// `service.name` of its resource.
fn spans(rx: &Upstream) -> Vec<(String, Span)> {
    let mut out = Vec::new();
    for req in rx.requests() {
        assert_eq!(req.path, "/v1/traces");
        assert_eq!(
            req.header("content-type").as_deref(),
            Some("application/x-protobuf")
        );
        let export = ExportTraceServiceRequest::decode(req.body.clone()).expect("OTLP protobuf");
        for rs in export.resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| r.attributes.iter())
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| text(kv.value.as_ref()?.value.as_ref()?))
                .unwrap_or_default();
            for ss in rs.scope_spans {
                out.extend(ss.spans.into_iter().map(|s| (service.clone(), s)));
            }
        }
    }
    out
}

fn text(v: &Any) -> Option<String> {
    match v {
        Any::StringValue(s) => Some(s.clone()),
        Any::IntValue(i) => Some(i.to_string()),
        Any::BoolValue(b) => Some(b.to_string()),
        _ => None,
    }
}

/// The attribute `key` of `span`, as text.
fn attr(span: &Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| text(kv.value.as_ref()?.value.as_ref()?))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The one span of `kind` named `name` whose attribute `mcp.method.name`… (the `n`-th, by start).
fn find<'a>(all: &'a [(String, Span)], kind: SpanKind, name: &str) -> Vec<&'a Span> {
    let mut found: Vec<&Span> = all
        .iter()
        .map(|(_, s)| s)
        .filter(|s| s.kind == kind as i32 && s.name == name)
        .collect();
    found.sort_by_key(|s| s.start_time_unix_nano);
    found
}

/// The `[telemetry]` section pointing at `rx`.
fn telemetry_toml(rx: &Upstream) -> String {
    format!(
        "\n[telemetry]\notlp_endpoint = \"http://{}\"\nservice_name = \"tg-test\"\nsample_ratio = 1.0\n",
        rx.addr
    )
}

/// Stops taskgate, which exports what is queued, and returns every span received.
async fn stop_and_collect(mut tg: Tg, rx: &Upstream) -> Vec<(String, Span)> {
    tg.running.take().expect("running").shutdown().await;
    spans(rx)
}

/// The upstream request's `traceparent` header and `params._meta.traceparent`.
fn parents_seen(req: &RecordedRequest) -> (Option<String>, Option<String>) {
    let meta = req.json()["params"]["_meta"]["traceparent"]
        .as_str()
        .map(str::to_string);
    (req.header("traceparent"), meta)
}

/// A 2025-11-25 task: the creating `tools/call` carries the client's context in `_meta` and a
/// proxy's in the header; `tasks/get` and `tasks/cancel` follow. Each request has its SERVER
/// span, each exchange its CLIENT span (child of it), the upstream sees the CLIENT span as
/// parent in both places, and the attributes are the MCP conventions'.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2025_task_lifecycle_is_one_trace_through_taskgate() {
    let rx = receiver().await;
    let up = TaskServer::default().await;
    let cfg = TgConfig::new(&up.url()).tasks("release_quiet_ms = 50");
    let tail = telemetry_toml(&rx);
    let tg = Tg::start(|store| cfg.to_toml(store) + &tail).await;
    let mut c = tg.client();
    c.initialize().await;
    let body = json!({"jsonrpc":"2.0","id":"c-1","method":"tools/call","params":{
        "name":"slow","arguments":{},"task":{"ttl":60000},
        "_meta":{"traceparent": traceparent(META_TRACE, META_SPAN), "tracestate":"congo=t61rcWkgMzE"}}})
    .to_string();
    let created: Value = c
        .req(body)
        .header("traceparent", &traceparent(HEADER_TRACE, HEADER_SPAN))
        .send()
        .await
        .json()
        .await;
    let task = created["result"]["task"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("{created}"))
        .to_string();
    assert_eq!(c.get("2", &task).await["result"]["status"], "working");
    assert_eq!(c.cancel("3", &task).await["result"]["status"], "cancelled");
    let call = up
        .received("tools/call")
        .pop()
        .expect("the call went upstream");
    let get = up
        .received("tasks/get")
        .pop()
        .expect("tasks/get went upstream");
    let released = eventually(STEP, || async {
        tg.record(&task).filter(|r| r.released_at.is_some())
    })
    .await
    .expect("resources released");
    let all = stop_and_collect(tg, &rx).await;

    assert!(all.iter().all(|(service, _)| service == "tg-test"));
    let server = find(&all, SpanKind::Server, "tools/call slow");
    let client = find(&all, SpanKind::Client, "tools/call slow");
    assert_eq!((server.len(), client.len()), (1, 1), "{all:#?}");
    let (server, client) = (server[0], client[0]);
    // Parent from `_meta`; the header's span linked.
    assert_eq!(hex(&server.trace_id), META_TRACE);
    assert_eq!(hex(&server.parent_span_id), META_SPAN);
    assert_eq!(
        server
            .links
            .iter()
            .map(|l| (hex(&l.trace_id), hex(&l.span_id)))
            .collect::<Vec<_>>(),
        vec![(HEADER_TRACE.to_string(), HEADER_SPAN.to_string())]
    );
    assert_eq!(server.trace_state, "congo=t61rcWkgMzE");
    for (key, want) in [
        ("mcp.method.name", "tools/call"),
        ("gen_ai.tool.name", "slow"),
        ("gen_ai.operation.name", "execute_tool"),
        ("mcp.protocol.version", "2025-11-25"),
        ("jsonrpc.request.id", "c-1"),
        ("server.address", "127.0.0.1"),
        ("network.transport", "tcp"),
    ] {
        assert_eq!(
            attr(server, key).as_deref(),
            Some(want),
            "{key}: {server:#?}"
        );
    }
    assert_eq!(
        attr(server, "server.port"),
        Some(up.up.addr.port().to_string())
    );
    assert!(attr(server, "mcp.session.id").is_some_and(|s| !s.is_empty()));
    assert_eq!(attr(server, "error.type"), None);
    // The CLIENT span: the SERVER span's child, and the upstream's parent in both places.
    assert_eq!(client.trace_id, server.trace_id);
    assert_eq!(client.parent_span_id, server.span_id);
    assert_eq!(attr(client, "network.transport").as_deref(), Some("tcp"));
    let want = Some(format!("00-{META_TRACE}-{}-01", hex(&client.span_id)));
    assert_eq!(parents_seen(&call), (want.clone(), want));
    // Only `_meta.traceparent` changed in the call's bytes.
    let sent = call.json();
    assert_eq!(sent["params"]["_meta"]["tracestate"], "congo=t61rcWkgMzE");
    assert_eq!(sent["params"]["task"], json!({"ttl": 60000}));

    // tasks/get and tasks/cancel: spans of their own, carrying the task id; the upstream saw the
    // get's CLIENT span.
    let get_server = find(&all, SpanKind::Server, "tasks/get");
    let get_client = find(&all, SpanKind::Client, "tasks/get");
    assert_eq!((get_server.len(), get_client.len()), (1, 1));
    assert_eq!(attr(get_server[0], "mcp.task.id"), Some(task.clone()));
    assert_eq!(attr(get_client[0], "mcp.task.id"), Some(task.clone()));
    assert_eq!(get_client[0].parent_span_id, get_server[0].span_id);
    let want = Some(format!(
        "00-{}-{}-01",
        hex(&get_client[0].trace_id),
        hex(&get_client[0].span_id)
    ));
    assert_eq!(parents_seen(&get), (want.clone(), want));
    let cancel = find(&all, SpanKind::Server, "tasks/cancel");
    assert_eq!(cancel.len(), 1);
    assert_eq!(attr(cancel[0], "mcp.task.id"), Some(task.clone()));

    // The task's life: the creating span carries its id and is kept in the record; the later
    // requests link to it; the two audit facts are span events in its trace, linked to it.
    assert_eq!(attr(server, "mcp.task.id"), Some(task.clone()));
    let creating = format!("00-{META_TRACE}-{}-01", hex(&server.span_id));
    assert_eq!(released.trace_parent.as_deref(), Some(creating.as_str()));
    let links_to_creation = |s: &Span| {
        s.links
            .iter()
            .any(|l| l.trace_id == server.trace_id && l.span_id == server.span_id)
    };
    assert!(links_to_creation(get_server[0]), "{:#?}", get_server[0]);
    assert!(links_to_creation(get_client[0]));
    assert!(links_to_creation(cancel[0]));
    for fact in ["mcp.task.status_cancelled", "mcp.task.resources_released"] {
        let spans = find(&all, SpanKind::Internal, fact);
        assert_eq!(spans.len(), 1, "{fact}: {all:#?}");
        let s = spans[0];
        assert_eq!(s.trace_id, server.trace_id, "{fact}");
        assert_eq!(s.parent_span_id, server.span_id, "{fact}");
        assert!(links_to_creation(s), "{fact}");
        assert_eq!(attr(s, "mcp.task.id"), Some(task.clone()));
        assert_eq!(
            s.events.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(),
            vec![fact]
        );
    }
}

/// A 2026-07-28 task: the parent from the HTTP header alone (no `_meta.traceparent`); the
/// upstream sees the CLIENT span in its header and in `_meta`, next to the `_meta` the client
/// sent; a JSON-RPC error answer is the span's `error.type`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2026_task_lifecycle_takes_its_parent_from_the_header() {
    let rx = receiver().await;
    let (up, _) = modern_server().await;
    let cfg = TgConfig::new(&up.url());
    let tail = telemetry_toml(&rx);
    let tg = Tg::start(|store| cfg.to_toml(store) + &tail).await;
    let url = tg.mcp_url();
    let (status, created) = send(
        modern_req(
            &url,
            None,
            1,
            "tools/call",
            json!({"name": "slow_compute", "arguments": {}}),
        )
        .header("traceparent", &traceparent(HEADER_TRACE, HEADER_SPAN)),
    )
    .await;
    assert_eq!(status, 200, "{created}");
    let task = created["result"]["taskId"].as_str().unwrap().to_string();
    let (_, got) = task_call(&url, None, 2, "tasks/get", &task).await;
    assert_eq!(got["result"]["status"], "working", "{got}");
    let (_, unknown) = task_call(&url, None, 3, "tasks/get", "no-such-task").await;
    assert!(unknown["error"]["code"].is_i64(), "{unknown}");
    let call = up
        .received("tools/call")
        .pop()
        .expect("the call went upstream");
    let all = stop_and_collect(tg, &rx).await;

    let server = find(&all, SpanKind::Server, "tools/call slow_compute");
    let client = find(&all, SpanKind::Client, "tools/call slow_compute");
    assert_eq!((server.len(), client.len()), (1, 1), "{all:#?}");
    let (server, client) = (server[0], client[0]);
    assert_eq!(hex(&server.trace_id), HEADER_TRACE);
    assert_eq!(hex(&server.parent_span_id), HEADER_SPAN);
    assert!(server.links.is_empty());
    assert_eq!(attr(server, "mcp.task.id"), Some(task.clone()));
    assert_eq!(
        attr(server, "mcp.protocol.version").as_deref(),
        Some("2026-07-28")
    );
    assert_eq!(attr(server, "jsonrpc.request.id").as_deref(), Some("1"));
    assert_eq!(
        attr(server, "mcp.session.id"),
        None,
        "2026-07-28 has no session"
    );
    assert_eq!(client.parent_span_id, server.span_id);
    let want = Some(format!("00-{HEADER_TRACE}-{}-01", hex(&client.span_id)));
    assert_eq!(parents_seen(&call), (want.clone(), want));
    assert_eq!(
        call.json()["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"],
        "2026-07-28",
        "the client's _meta is kept"
    );
    let gets = find(&all, SpanKind::Server, "tasks/get");
    assert_eq!(gets.len(), 2);
    assert_eq!(attr(gets[0], "error.type"), None);
    assert_eq!(
        attr(gets[1], "error.type"),
        Some(unknown["error"]["code"].to_string())
    );
    // Tester 5 #7a: a span with `error.type` has status ERROR (2), one without none (UNSET).
    let code = |s: &Span| s.status.as_ref().map_or(0, |st| st.code);
    assert_eq!((code(gets[0]), code(gets[1])), (0, 2));
    // No parent anywhere: a trace of its own.
    assert!(gets[0].parent_span_id.is_empty());
}

/// Without `[telemetry]` nothing is added: the upstream gets the client's own `traceparent`
/// header and body, byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn off_without_an_endpoint_the_request_goes_as_it_came() {
    let up = TaskServer::default().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    c.initialize().await;
    let body = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"slow","arguments":{}, "task":{"ttl":60000}}}"#;
    let tp = traceparent(HEADER_TRACE, HEADER_SPAN);
    let _ = c
        .req(body)
        .header("traceparent", &tp)
        .send()
        .await
        .json()
        .await;
    let call = up.received("tools/call").pop().unwrap();
    assert_eq!(call.body_str(), body);
    assert_eq!(call.header("traceparent"), Some(tp));
}

/// A stdio child has no header fields: it sees the CLIENT span (`network.transport = "pipe"`)
/// as its parent in `params._meta.traceparent`, the rest of the message as the client sent it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdio_child_sees_the_client_span_in_meta() {
    let rx = receiver().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let server = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/stdio/fake_server.py");
    let tail = telemetry_toml(&rx);
    let tg = Tg::start(|store| {
        format!(
            "[gateway]\nlisten = \"127.0.0.1:0\"\n\n[admin]\nlisten = \"127.0.0.1:0\"\n\n[store]\npath = {store:?}\n\n[auth]\nmode = \"none\"\n\n[[upstream]]\nname = \"default\"\ncommand = [\"python3\", {server:?}]\ntimeout_ms = 5000\n\n[upstream.env]\nSTDIO_LOG = {:?}\n{tail}",
            log.display().to_string()
        )
    })
    .await;
    let mut c = tg.client();
    c.initialize().await;
    let body = json!({"jsonrpc":"2.0","id":5,"method":"tools/call","params":{
        "name":"echo","arguments":{"text":"hi"}}})
    .to_string();
    let answer = c
        .req(body)
        .header("traceparent", &traceparent(HEADER_TRACE, HEADER_SPAN))
        .send()
        .await
        .json()
        .await;
    assert_eq!(answer["result"]["content"][0]["text"], "hi", "{answer}");
    let seen: Vec<Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .filter(|m: &Value| m["method"] == "tools/call")
        .collect();
    let all = stop_and_collect(tg, &rx).await;
    let client = find(&all, SpanKind::Client, "tools/call echo");
    assert_eq!(client.len(), 1, "{all:#?}");
    assert_eq!(
        attr(client[0], "network.transport").as_deref(),
        Some("pipe")
    );
    assert_eq!(
        attr(client[0], "server.address").as_deref(),
        Some("python3")
    );
    assert_eq!(hex(&client[0].trace_id), HEADER_TRACE);
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0]["params"]["_meta"]["traceparent"],
        format!("00-{HEADER_TRACE}-{}-01", hex(&client[0].span_id))
    );
    assert_eq!(seen[0]["params"]["arguments"], json!({"text": "hi"}));
    let server = find(&all, SpanKind::Server, "tools/call echo");
    assert_eq!(
        attr(server[0], "network.transport").as_deref(),
        Some("pipe")
    );
}

/// An upgraded call: the plain `tools/call` the client sent is the task's creating span; the
/// CLIENT spans of taskgate's own `tasks/get`/`tasks/result` polls link to it and carry its id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgraded_calls_polls_link_to_the_clients_call() {
    let rx = receiver().await;
    let up = UpServer::start(UpBehaviour {
        task_ms: Some(300),
        ..UpBehaviour::default()
    })
    .await;
    let cfg = UgConfig::new(&up.url());
    let tail = telemetry_toml(&rx);
    let tg = Tg::start(|store| cfg.to_toml(store) + &tail).await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    let _ = c.rpc(rpc("\"list\"", "tools/list", "{}")).await;
    let id = json!(9);
    let body = call_body("9", "research", None);
    let out = call(&c, &body, &id).await;
    assert_eq!(out.answer["id"], id, "{out:?}");
    let task = up.task_of_request(&id).expect("an upstream task");
    let record = tg.record(&task).expect("recorded");
    let all = stop_and_collect(tg, &rx).await;

    let server = find(&all, SpanKind::Server, "tools/call research");
    assert_eq!(server.len(), 1, "{all:#?}");
    let server = server[0];
    assert_eq!(attr(server, "mcp.task.id"), Some(task.clone()));
    assert_eq!(
        record.trace_parent,
        Some(format!(
            "00-{}-{}-01",
            hex(&server.trace_id),
            hex(&server.span_id)
        ))
    );
    let polls: Vec<&Span> = ["tasks/get", "tasks/result"]
        .iter()
        .flat_map(|m| find(&all, SpanKind::Client, m))
        .collect();
    assert!(!polls.is_empty(), "{all:#?}");
    for poll in polls {
        assert_eq!(attr(poll, "mcp.task.id"), Some(task.clone()));
        assert!(
            poll.links
                .iter()
                .any(|l| l.trace_id == server.trace_id && l.span_id == server.span_id),
            "{poll:#?}"
        );
    }
}

/// `check-config` refuses the `OTEL_*` values `serve` refuses at its start (a sampler taskgate
/// does not know, a ratio out of range, an endpoint that is not an http(s) URL), naming the
/// variable, and accepts the ones `serve` takes.
#[test]
fn check_config_refuses_the_otel_variables_serve_refuses() {
    let b = GatewayBuilder::new().upstream("default", "http://127.0.0.1:3000/mcp");
    let f = ConfigFile::from_builder(&b);
    let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318");
    for (bad, named) in [
        (
            vec![endpoint, ("OTEL_TRACES_SAMPLER", "sometimes")],
            "OTEL_TRACES_SAMPLER",
        ),
        (
            vec![
                endpoint,
                ("OTEL_TRACES_SAMPLER", "traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", "2"),
            ],
            "OTEL_TRACES_SAMPLER_ARG",
        ),
        (
            vec![("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "collector:4318")],
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        ),
        (
            vec![endpoint, ("OTEL_EXPORTER_OTLP_TIMEOUT", "10s")],
            "OTEL_EXPORTER_OTLP_TIMEOUT",
        ),
        (
            vec![endpoint, ("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "zstd")],
            "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
        ),
    ] {
        let serve = run_taskgate(&["serve", "--config", f.path_str()], &bad);
        assert_eq!(
            serve.status.code(),
            Some(1),
            "serve with {bad:?}: {serve:?}"
        );
        assert!(serve.stderr.contains(named), "{bad:?}: {}", serve.stderr);
        let check = run_taskgate(&["check-config", f.path_str()], &bad);
        assert_eq!(
            check.status.code(),
            Some(1),
            "check-config with {bad:?}: {check:?}"
        );
        assert!(check.stderr.contains(named), "{bad:?}: {}", check.stderr);
    }
    let good = [
        endpoint,
        ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
        ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
        ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "2500"),
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
    ];
    let check = run_taskgate(&["check-config", f.path_str()], &good);
    assert!(check.status.success(), "{check:?}");
}

/// `OTEL_EXPORTER_OTLP_COMPRESSION=gzip`: the taskgate binary (its endpoint from
/// `OTEL_EXPORTER_OTLP_ENDPOINT`) posts its exports gzipped, with `Content-Encoding: gzip`, and
/// once gunzipped they are the spans (issue 34).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_compression_gzips_the_export_bodies() {
    use std::io::Read as _;
    let rx = receiver().await;
    let up = Upstream::start(|req| {
        ScriptedResponse::json(rpc_result(&req.rpc_id_json(), r#"{"content":[]}"#))
    })
    .await;
    let f = ConfigFile::from_builder(&GatewayBuilder::single(&up.url()));
    let endpoint = format!("http://{}", rx.addr);
    let mut p = TaskgateProcess::spawn(
        &["serve", "--config", f.path_str()],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
        ],
    );
    let (gw, _) = p.listening();
    let r = Req::mcp_post(
        &format!("http://{gw}/mcp"),
        rpc("9", "tools/call", r#"{"name":"zipped"}"#),
    )
    .header("mcp-protocol-version", PROTOCOL_VERSION)
    .send()
    .await;
    assert_eq!(r.status(), 200);
    // A graceful stop exports what is queued.
    p.sigterm();
    assert!(p.wait_exit(STEP).is_some(), "no exit");
    let posts = rx.requests();
    assert!(!posts.is_empty(), "nothing exported");
    let mut names = Vec::new();
    for post in posts {
        assert_eq!(post.header("content-encoding").as_deref(), Some("gzip"));
        let mut body = Vec::new();
        flate2::read::GzDecoder::new(&post.body[..])
            .read_to_end(&mut body)
            .expect("a gzip body");
        let export = ExportTraceServiceRequest::decode(&body[..]).expect("OTLP protobuf");
        for rs in export.resource_spans {
            for ss in rs.scope_spans {
                names.extend(ss.spans.into_iter().map(|s| (s.kind, s.name)));
            }
        }
    }
    assert!(
        names.contains(&(SpanKind::Server as i32, "tools/call zipped".to_string())),
        "{names:?}"
    );
    assert!(
        names.contains(&(SpanKind::Client as i32, "tools/call zipped".to_string())),
        "{names:?}"
    );
}

/// A bridged call: a 2025-11-25 client's task-augmented `tools/call` through the forward bridge
/// to a 2026-07-28 server. The client's SERVER span (parent from its `_meta`) carries the task
/// id and is the parent of the 2026 exchange's CLIENT span, which the upstream sees as its
/// parent; the client's `tasks/get` and blocking `tasks/result` are SERVER spans linked to the
/// creation, and every upstream `tasks/get` the bridge sends for them (the result's polls
/// included) is a CLIENT span under the request it serves, linked to the creation, carrying
/// `mcp.task.id`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bridged_calls_spans_link_to_the_2025_clients_creation() {
    let rx = receiver().await;
    let (up, state) = modern_server().await;
    let cfg = TgConfig::new(&up.url());
    let tail = telemetry_toml(&rx);
    let tg = Tg::start(|store| cfg.to_toml(store) + &tail).await;
    let mut c = tg.client();
    c.initialize().await;
    let body = json!({"jsonrpc":"2.0","id":"b-1","method":"tools/call","params":{
        "name":"slow_compute","arguments":{},"task":{"ttl":60000},
        "_meta":{"traceparent": traceparent(META_TRACE, META_SPAN)}}})
    .to_string();
    let created: Value = c.req(body).send().await.json().await;
    let task = created["result"]["task"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("not a 2025 CreateTaskResult: {created}"))
        .to_string();
    assert_eq!(
        tg.record(&task).map(|r| r.origin),
        Some(taskgate::store::Origin::Bridged)
    );
    let call = up.received("tools/call").pop().expect("bridged upstream");
    assert!(
        call.json()["params"].get("task").is_none(),
        "a 2026 request"
    );
    assert_eq!(c.get("2", &task).await["result"]["status"], "working");
    let waiting = {
        let c = Client {
            url: c.url.clone(),
            token: None,
            session: c.session.clone(),
        };
        let task = task.clone();
        tokio::spawn(async move { c.result("3", &task).await })
    };
    // The blocking result polls: the client's tasks/get and two of the bridge's.
    assert!(up.wait_for_method("tasks/get", 3, STEP).await);
    state
        .lock()
        .unwrap()
        .tasks
        .insert(task.clone(), "completed".into());
    let result = waiting.await.unwrap();
    assert_eq!(
        result["result"]["content"][0]["text"],
        format!("done {task}")
    );
    let gets_seen = up.received("tasks/get");
    let all = stop_and_collect(tg, &rx).await;

    let server = find(&all, SpanKind::Server, "tools/call slow_compute");
    let client = find(&all, SpanKind::Client, "tools/call slow_compute");
    assert_eq!((server.len(), client.len()), (1, 1), "{all:#?}");
    let (server, client) = (server[0], client[0]);
    assert_eq!(hex(&server.trace_id), META_TRACE);
    assert_eq!(hex(&server.parent_span_id), META_SPAN);
    assert_eq!(attr(server, "mcp.task.id"), Some(task.clone()));
    assert_eq!(
        attr(server, "mcp.protocol.version").as_deref(),
        Some("2025-11-25")
    );
    assert_eq!(client.trace_id, server.trace_id);
    assert_eq!(client.parent_span_id, server.span_id);
    let want = Some(format!("00-{META_TRACE}-{}-01", hex(&client.span_id)));
    assert_eq!(parents_seen(&call), (want.clone(), want));
    let links_to_creation = |s: &Span| {
        s.links
            .iter()
            .any(|l| l.trace_id == server.trace_id && l.span_id == server.span_id)
    };

    let get = find(&all, SpanKind::Server, "tasks/get");
    let result = find(&all, SpanKind::Server, "tasks/result");
    assert_eq!((get.len(), result.len()), (1, 1), "{all:#?}");
    for s in [get[0], result[0]] {
        assert_eq!(attr(s, "mcp.task.id"), Some(task.clone()), "{s:#?}");
        assert!(links_to_creation(s), "{s:#?}");
    }
    // Every upstream tasks/get: a CLIENT span under the client's request it serves, linked to
    // the creation, whose context is the parent the upstream saw.
    let polls = find(&all, SpanKind::Client, "tasks/get");
    assert_eq!(polls.len(), gets_seen.len(), "{all:#?}");
    assert!(polls.len() >= 3, "{all:#?}");
    let under = |parent: &Span| {
        polls
            .iter()
            .filter(|p| p.trace_id == parent.trace_id && p.parent_span_id == parent.span_id)
            .count()
    };
    assert_eq!(under(get[0]), 1);
    assert_eq!(under(result[0]), polls.len() - 1);
    for poll in &polls {
        assert_eq!(attr(poll, "mcp.task.id"), Some(task.clone()), "{poll:#?}");
        assert!(links_to_creation(poll), "{poll:#?}");
        let seen = format!("00-{}-{}-01", hex(&poll.trace_id), hex(&poll.span_id));
        assert!(
            gets_seen
                .iter()
                .any(|r| parents_seen(r) == (Some(seen.clone()), Some(seen.clone()))),
            "{seen}"
        );
    }
}

/// Tester 5 #1: a client's texts are cut in its spans: a 100 KB tool name, string id, `taskId`
/// and method each keep at most 256 bytes (cut at a character boundary) in the span's name and
/// attributes, so a few huge requests cannot fill the export queue with megabytes (RSS 940 MB
/// before) nor make an export body a collector refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_huge_texts_are_cut_in_its_spans() {
    let rx = receiver().await;
    let up = TaskServer::default().await;
    let cfg = TgConfig::new(&up.url());
    let tail = telemetry_toml(&rx);
    let tg = Tg::start(|store| cfg.to_toml(store) + &tail).await;
    let mut c = tg.client();
    c.initialize().await;
    // Two-byte characters after one ASCII byte: 256 falls inside one.
    let huge = format!("x{}", "é".repeat(50_000));
    let id = "i".repeat(100_000);
    for body in [
        json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":huge,"arguments":{}}}),
        json!({"jsonrpc":"2.0","id":2,"method":"tasks/get","params":{"taskId":huge}}),
        json!({"jsonrpc":"2.0","id":3,"method":huge,"params":{}}),
    ] {
        let _ = c.req(&body.to_string()).send().await;
    }
    let all = stop_and_collect(tg, &rx).await;
    let cut = format!("x{}", "é".repeat(127));
    assert_eq!(cut.len(), 255);
    let call = find(&all, SpanKind::Server, &format!("tools/call {cut}"));
    assert_eq!(
        call.len(),
        1,
        "{:?}",
        all.iter().map(|(_, s)| s.name.len()).collect::<Vec<_>>()
    );
    assert_eq!(attr(call[0], "gen_ai.tool.name"), Some(cut.clone()));
    assert_eq!(attr(call[0], "jsonrpc.request.id"), Some("i".repeat(256)));
    let get = find(&all, SpanKind::Server, "tasks/get");
    assert_eq!(attr(get[0], "mcp.task.id"), Some(cut.clone()));
    for (_, span) in &all {
        assert!(span.name.len() <= 11 + 256, "{}", span.name.len());
        for kv in &span.attributes {
            let v = kv
                .value
                .as_ref()
                .and_then(|v| v.value.as_ref())
                .and_then(text);
            assert!(
                v.is_none_or(|v| v.len() <= 256),
                "{} of {}",
                kv.key,
                span.name
            );
        }
    }
}
