//! `GET /openapi.json` (issue 20): the OpenAPI 3.1 document the server serves is checked
//! by a real validator (openapi-spec-validator from PyPI, in the venv `.ci/test` sets up
//! with tests/openapi/setup and names in `LIVEGATE_OPENAPI_VALIDATOR`; without it these
//! tests fail, never skip), against the routes the server registers
//! (`livegate::http::ROUTES`, the same table `configure` registers from) in both
//! directions, against what a real request to each route reaches, and against the real
//! answers of a running server (tests/openapi/check_answers.py validates each body with
//! the documented schema, made strict, on the venv's python).

use crate::common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use serde_json::{json, Value};

const METHODS: [&str; 8] = ["get", "put", "post", "delete", "patch", "head", "options", "trace"];

fn validator() -> PathBuf {
    let hint = "set it up with .ci/test (tests/openapi/setup builds the venv tests/openapi/.venv and \
                .ci/test exports LIVEGATE_OPENAPI_VALIDATOR=tests/openapi/.venv/bin/openapi-spec-validator)";
    let Some(value) = std::env::var_os("LIVEGATE_OPENAPI_VALIDATOR").filter(|v| !v.is_empty())
    else {
        panic!("LIVEGATE_OPENAPI_VALIDATOR is not set: {hint}");
    };
    let path = PathBuf::from(value);
    let path = if path.is_relative() { Path::new(crate::common::REPO).join(path) } else { path };
    assert!(path.is_file(), "LIVEGATE_OPENAPI_VALIDATOR={} does not exist: {hint}", path.display());
    path
}

/// The venv's python, beside its validator.
fn venv_python() -> PathBuf {
    let python = validator().with_file_name("python");
    assert!(python.is_file(), "no python beside the validator: {}", python.display());
    python
}

/// `method path` on the server without credentials: status, Content-Type and body text.
fn call(
    server: &TestServer,
    method: &str,
    path: &str,
    auth: bool,
    body: Option<&Value>,
) -> (u16, String, String) {
    let mut request = ureq::request(method, &format!("http://{}{}", server.addr, path));
    if auth {
        request = request.set("Authorization", &format!("Bearer {API_KEY}"));
    }
    let result = match body {
        Some(body) => request.send_json(body.clone()),
        None => request.call(),
    };
    let response = match result {
        Ok(response) => response,
        Err(ureq::Error::Status(_, response)) => response,
        Err(e) => panic!("{method} {path}: {e}"),
    };
    let status = response.status();
    let content_type = response.header("content-type").unwrap_or("").to_string();
    (
        status,
        content_type,
        response.into_string().unwrap_or_else(|e| panic!("{method} {path}: body: {e}")),
    )
}

fn served_document(server: &TestServer) -> Value {
    let (status, content_type, text) = call(server, "GET", "/openapi.json", false, None);
    assert_eq!(status, 200, "GET /openapi.json: {text}");
    assert!(
        content_type.starts_with("application/json"),
        "GET /openapi.json has Content-Type {content_type:?}"
    );
    assert_eq!(
        text,
        include_str!("../../src/web/openapi.json"),
        "the server serves src/web/openapi.json as it is"
    );
    serde_json::from_str(&text).expect("/openapi.json is JSON")
}

/// Runs the validator on `doc`; its exit status and output.
fn validate(doc: &Value, dir: &Path, name: &str) -> (bool, String) {
    let file = dir.join(name);
    std::fs::write(&file, serde_json::to_vec_pretty(doc).unwrap()).unwrap();
    let output = Command::new(validator())
        .args(["--schema", "3.1", "--validation-errors", "all"])
        .arg(&file)
        .output()
        .expect("run openapi-spec-validator");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

/// Every (METHOD, path) the document describes.
fn documented_operations(doc: &Value) -> BTreeSet<(String, String)> {
    let paths = doc["paths"].as_object().expect("paths is an object");
    let mut operations = BTreeSet::new();
    for (path, item) in paths {
        for method in METHODS {
            if item.get(method).is_some() {
                operations.insert((method.to_uppercase(), path.clone()));
            }
        }
    }
    operations
}

fn registered_routes() -> BTreeSet<(String, String)> {
    livegate::http::ROUTES.iter().map(|(m, p)| (m.to_string(), p.to_string())).collect()
}

/// The error codes `ErrorCode::as_str` names, read from its source.
fn error_codes_in_source() -> BTreeSet<String> {
    let source = include_str!("../../src/protocol/codes.rs");
    let start = source
        .find("pub fn as_str(self) -> &'static str")
        .expect("ErrorCode::as_str in src/protocol/codes.rs");
    let body = &source[start..start + source[start..].find("\n    }\n").expect("end of as_str")];
    body.lines()
        .filter_map(|line| line.trim().strip_prefix("ErrorCode::"))
        .filter_map(|rest| rest.split('"').nth(1).map(str::to_string))
        .collect()
}

#[test]
fn the_served_document_passes_the_openapi_validator() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let doc = served_document(&server);
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(
        doc["info"]["version"],
        env!("CARGO_PKG_VERSION"),
        "info.version follows Cargo.toml's version"
    );
    let dir = tempfile::tempdir().unwrap();
    let (ok, output) = validate(&doc, dir.path(), "openapi.json");
    assert!(ok, "openapi-spec-validator refused /openapi.json:\n{output}");

    // The validator can fail: a response without its required description and a path
    // parameter that is not declared are both refused.
    let mut broken = doc.clone();
    broken["paths"]["/v1/tokens"]["post"]["responses"]["201"]
        .as_object_mut()
        .unwrap()
        .remove("description");
    let (ok, output) = validate(&broken, dir.path(), "broken-response.json");
    assert!(!ok, "the validator accepted a response without a description:\n{output}");
    let mut broken = doc.clone();
    let item = broken["paths"]["/v1/rooms/{room}/state"].take();
    broken["paths"]
        .as_object_mut()
        .unwrap()
        .insert("/v1/rooms/{room}/state/{undeclared}".into(), item);
    let (ok, output) = validate(&broken, dir.path(), "broken-parameter.json");
    assert!(!ok, "the validator accepted an undeclared path parameter:\n{output}");
}

#[test]
fn every_registered_route_is_documented_and_every_documented_one_registered() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let doc = served_document(&server);
    let documented = documented_operations(&doc);
    let registered = registered_routes();
    assert_eq!(registered.len(), livegate::http::ROUTES.len(), "ROUTES names a route twice");
    let undocumented: Vec<_> = registered.difference(&documented).collect();
    let unregistered: Vec<_> = documented.difference(&registered).collect();
    assert!(
        undocumented.is_empty() && unregistered.is_empty(),
        "registered but not in /openapi.json: {undocumented:?}\nin /openapi.json but not registered: {unregistered:?}"
    );
    for path in ["/v1/admin/overview", "/admin", "/openapi.json", "/livegate.d.ts"] {
        assert!(
            documented.contains(&("GET".to_string(), path.to_string())),
            "GET {path} is documented"
        );
    }

    // Every path parameter of a template is declared, in the path item or the operation.
    for (method, path) in &documented {
        let item = &doc["paths"][path];
        let operation = &item[method.to_lowercase()];
        let declared: BTreeSet<String> = [&item["parameters"], &operation["parameters"]]
            .into_iter()
            .filter_map(Value::as_array)
            .flatten()
            .map(|p| resolve_ref(&doc, p))
            .filter(|p| p["in"] == "path")
            .map(|p| p["name"].as_str().unwrap().to_string())
            .collect();
        let in_template: BTreeSet<String> = path
            .split('{')
            .skip(1)
            .map(|rest| rest.split('}').next().unwrap().to_string())
            .collect();
        assert_eq!(declared, in_template, "{method} {path}: path parameters");
    }

    // Every `$ref` points at something (the validator does not look).
    let mut dangling = Vec::new();
    check_refs(&doc, &doc, &mut dangling);
    assert!(dangling.is_empty(), "dangling $refs: {dangling:?}");

    // The error codes the document lists are the server's.
    let listed: BTreeSet<String> = doc["components"]["schemas"]["ErrorCode"]["anyOf"][0]["enum"]
        .as_array()
        .expect("ErrorCode lists its codes")
        .iter()
        .map(|c| c.as_str().unwrap().to_string())
        .collect();
    let codes = error_codes_in_source();
    assert!(codes.len() >= 20, "read the codes of ErrorCode::as_str: {codes:?}");
    assert_eq!(listed, codes, "ErrorCode in /openapi.json and in src/protocol/codes.rs");

    // The three webhooks of the contract, each with its type and the signature header.
    let webhooks = doc["webhooks"].as_object().expect("a webhooks object");
    let mut types = BTreeSet::new();
    for (name, item) in webhooks {
        let post = &item["post"];
        let headers: Vec<&str> = post["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        assert!(
            headers.contains(&"X-Livegate-Signature") && headers.contains(&"X-Livegate-Id"),
            "{name}: headers {headers:?}"
        );
        let schema =
            resolve_ref(&doc, &post["requestBody"]["content"]["application/json"]["schema"]);
        types.insert(schema["properties"]["type"]["const"].as_str().unwrap().to_string());
    }
    assert_eq!(
        types,
        BTreeSet::from(["room_occupied".into(), "room_vacated".into(), "client_published".into()])
    );
}

/// Collects every `$ref` under `node` that does not resolve in `doc`.
fn check_refs(doc: &Value, node: &Value, dangling: &mut Vec<String>) {
    match node {
        Value::Object(map) => {
            if let Some(Value::String(reference)) = map.get("$ref") {
                if doc.pointer(reference.trim_start_matches('#')).is_none() {
                    dangling.push(reference.clone());
                }
            }
            map.values().for_each(|v| check_refs(doc, v, dangling));
        }
        Value::Array(items) => items.iter().for_each(|v| check_refs(doc, v, dangling)),
        _ => {}
    }
}

/// A local `$ref` followed to its target.
fn resolve_ref<'a>(doc: &'a Value, node: &'a Value) -> &'a Value {
    match node["$ref"].as_str() {
        Some(reference) => doc
            .pointer(reference.trim_start_matches('#'))
            .unwrap_or_else(|| panic!("dangling $ref {reference}")),
        None => node,
    }
}

/// A route's template with example values in its parameters.
fn concrete(path: &str) -> String {
    path.replace("{room}", "lobby").replace("{user}", "u1")
}

/// The answer of the router's default service (`not_found` in src/http/operations.rs).
fn is_no_route(status: u16, body: &str, method: &str, path: &str) -> bool {
    let no_route = format!("no route for {method} {path}");
    status == 404
        && serde_json::from_str::<Value>(body)
            .is_ok_and(|b| b["error"]["message"] == no_route.as_str())
}

#[test]
fn every_route_in_the_table_reaches_a_handler() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    // The check can tell: a path nobody registered, and a registered path with a method it
    // does not have, get the router's own 404.
    for (method, path) in
        [("GET", "/v1/nothing-here"), ("GET", "/v1/tokens"), ("PATCH", "/v1/rooms/lobby/events")]
    {
        let (status, _, body) = call(&server, method, path, false, None);
        assert!(
            is_no_route(status, &body, method, path),
            "{method} {path} should be the router's 404: {status} {body}"
        );
    }
    let mut missing = Vec::new();
    for (method, template) in livegate::http::ROUTES {
        let path = concrete(template);
        let (status, _, body) = call(&server, method, &path, false, None);
        if is_no_route(status, &body, method, &path) {
            missing.push(format!("{method} {template}"));
        }
    }
    assert!(missing.is_empty(), "routes in ROUTES that actix does not serve: {missing:?}");
}

/// One real answer, as check_answers.py reads it.
pub(crate) fn answer(
    method: &str,
    template: &str,
    (status, content_type, text): (u16, String, String),
) -> Value {
    let body = serde_json::from_str::<Value>(&text).ok();
    json!({"method": method, "path": template, "status": status, "content_type": content_type, "body": body})
}

pub(crate) fn check_answers(
    doc: &Value,
    answers: &[Value],
    dir: &Path,
    name: &str,
) -> (bool, String) {
    let doc_file = dir.join(format!("{name}-openapi.json"));
    let answers_file = dir.join(format!("{name}-answers.json"));
    std::fs::write(&doc_file, serde_json::to_vec(doc).unwrap()).unwrap();
    std::fs::write(&answers_file, serde_json::to_vec_pretty(answers).unwrap()).unwrap();
    let script = Path::new(crate::common::REPO).join("tests/openapi/check_answers.py");
    let output = Command::new(venv_python())
        .arg(script)
        .arg(&doc_file)
        .arg(&answers_file)
        .output()
        .expect("run check_answers.py");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

#[tokio::test(flavor = "multi_thread")]
async fn real_answers_match_the_documented_responses() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let doc = served_document(&server);
    let s = &server;
    let mut answers = Vec::new();
    let mut add = |method: &str, template: &str, path: &str, auth: bool, body: Option<Value>| {
        let got = call(s, method, path, auth, body.as_ref());
        answers.push(answer(method, template, got.clone()));
        got
    };

    // The documented error body, spot-checked here too: a 401 has error.code and message.
    let (status, content_type, text) =
        add("POST", "/v1/tokens", "/v1/tokens", false, Some(json!({"user": "u1"})));
    assert_eq!(status, 401);
    assert!(content_type.starts_with("application/json"), "{content_type}");
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(body["error"]["code"], "unauthorized", "{body}");
    assert!(body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
    let error_schema = &doc["components"]["schemas"]["Error"];
    assert_eq!(error_schema["required"], json!(["error"]));
    assert_eq!(error_schema["properties"]["error"]["required"], json!(["code", "message"]));

    let token_body = json!({"user": "u1", "device": "web", "ttl_secs": 60, "rooms": ["lobby", "chat:*"], "publish": ["chat:*"]});
    add("POST", "/v1/tokens", "/v1/tokens", true, Some(token_body));
    add("POST", "/v1/tokens", "/v1/tokens", true, Some(json!({"user": "u1", "nope": 1})));
    add("POST", "/v1/tokens", "/v1/tokens", true, Some(json!({"user": "u1", "ttl_secs": 0})));
    let events = "/v1/rooms/{room}/events";
    add(
        "POST",
        events,
        "/v1/rooms/lobby/events",
        true,
        Some(json!({"id": "e-1", "data": {"a": 1}, "state": {"n": 1}})),
    );
    add(
        "POST",
        events,
        "/v1/rooms/lobby/events",
        true,
        Some(json!({"id": "e-1", "data": {"a": 1}})),
    );
    add("POST", events, "/v1/rooms/lobby/events", true, Some(json!({"data": null})));
    add("POST", events, "/v1/rooms/bad%20room/events", true, Some(json!({"data": 1})));
    add("POST", events, "/v1/rooms/lobby/events", true, Some(json!({"data": "x".repeat(70_000)})));
    add("POST", events, "/v1/rooms/lobby/events", false, Some(json!({"data": 1})));
    add("GET", events, "/v1/rooms/lobby/events?since=0&limit=10", true, None);
    add("GET", events, "/v1/rooms/empty/events", true, None);
    add("GET", events, "/v1/rooms/lobby/events?limit=100000", true, None);
    let state = "/v1/rooms/{room}/state";
    add("PUT", state, "/v1/rooms/lobby/state", true, Some(json!({"data": {"n": 2}})));
    add("PUT", state, "/v1/rooms/user:u1/state", true, Some(json!({"data": 1})));
    add("GET", state, "/v1/rooms/lobby/state", true, None);
    add("GET", state, "/v1/rooms/fresh/state", true, None);
    let presence = "/v1/rooms/{room}/presence";
    let mut client = server.client("u2").await;
    client.subscribe("lobby").await;
    add("GET", presence, "/v1/rooms/lobby/presence", true, None);
    add("GET", presence, "/v1/rooms/user:u1/presence", true, None);
    // The admin overview while a room has a subscriber, so its rooms list is not empty.
    add("GET", "/v1/admin/overview", "/v1/admin/overview", true, None);
    add("GET", "/v1/admin/overview", "/v1/admin/overview", false, None);
    let messages = "/v1/users/{user}/messages";
    add(
        "POST",
        messages,
        "/v1/users/u1/messages",
        true,
        Some(json!({"id": "m-1", "data": {"t": "hi"}, "devices": ["phone"]})),
    );
    add(
        "POST",
        messages,
        "/v1/users/u1/messages",
        true,
        Some(json!({"id": "m-1", "data": {"t": "hi"}})),
    );
    let kick = "/v1/users/{user}/connections";
    add("DELETE", kick, "/v1/users/u2/connections?device=web", true, None);
    add("DELETE", kick, "/v1/users/u2/connections", false, None);
    drop(client);
    add("GET", "/v1/route", "/v1/route?user=u1", true, None);
    add("GET", "/v1/route", "/v1/route", true, None);
    add("GET", "/v1/ws", "/v1/ws?token=x", false, None);
    let ws_handshake = |query: &str| {
        let request = ureq::get(&format!("http://{}/v1/ws{query}", s.addr))
            .set("Connection", "Upgrade")
            .set("Upgrade", "websocket")
            .set("Sec-WebSocket-Version", "13")
            .set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==");
        let response = match request.call() {
            Err(ureq::Error::Status(_, response)) => response,
            other => {
                panic!("a refused WebSocket handshake answers with an error status: {other:?}")
            }
        };
        let content_type = response.header("content-type").unwrap_or("").to_string();
        (response.status(), content_type, response.into_string().unwrap())
    };
    answers.push(answer("GET", "/v1/ws", ws_handshake("")));
    answers.push(answer("GET", "/v1/ws", ws_handshake("?token=not-a-token")));
    answers.push(answer("GET", "/v1/ws", ws_handshake("?resume=not-a-credential")));
    let mut add = |method: &str, template: &str, path: &str, auth: bool, body: Option<Value>| {
        let got = call(s, method, path, auth, body.as_ref());
        answers.push(answer(method, template, got.clone()));
        got
    };
    add("GET", "/v1/sse", "/v1/sse?rooms=lobby", false, None);
    add("GET", "/v1/sse", "/v1/sse?token=x&rooms=bad%20room", false, None);
    add("GET", "/v1/sse", "/v1/sse?token=x&since=garbage", false, None);
    add("GET", "/v1/sse", "/v1/sse?token=x&state=maybe", false, None);
    add("GET", "/healthz", "/healthz", false, None);
    add("GET", "/readyz", "/readyz", false, None);
    add("GET", "/metrics", "/metrics", false, None);
    add("GET", "/livegate.js", "/livegate.js", false, None);
    add("GET", "/livegate.iife.js", "/livegate.iife.js", false, None);
    add("GET", "/livegate.d.ts", "/livegate.d.ts", false, None);
    add("GET", "/livegate/{file}", "/livegate/client.js", false, None);
    add("GET", "/livegate/{file}", "/livegate/no-such-module.js", false, None);
    add("GET", "/openapi.json", "/openapi.json", false, None);
    add("GET", "/", "/", false, None);
    add("GET", "/demo/token", "/demo/token", false, None);
    add("GET", "/admin", "/admin", false, None);
    add("GET", "/v1/admin/status", "/v1/admin/status", true, None);
    add("GET", "/v1/admin/status", "/v1/admin/status", false, None);
    add("POST", "/v1/admin/reload", "/v1/admin/reload", true, None);
    // A single node: the progress is empty, and a rebalance is refused (409 conflict).
    add("GET", "/v1/admin/rebalance", "/v1/admin/rebalance", true, None);
    add("GET", "/v1/admin/rebalance", "/v1/admin/rebalance", false, None);
    add("POST", "/v1/admin/rebalance", "/v1/admin/rebalance", true, Some(json!({})));
    add("POST", "/v1/admin/rebalance", "/v1/admin/rebalance", true, Some(json!({"per_second": 0})));
    // A single node probes no cell: 409 conflict (tests/it/cluster/cells.rs checks the 200).
    add("GET", "/v1/admin/cells", "/v1/admin/cells", true, None);
    add("GET", "/v1/admin/cells", "/v1/admin/cells", false, None);
    add("GET", "/v1/echo", "/v1/echo", false, None);

    // An SSE stream that opens: its first bytes, with the documented media type.
    let token = server.mint_token("u3", "web");
    let response = ureq::get(&format!("http://{}/v1/sse?token={token}&rooms=lobby", server.addr))
        .call()
        .expect("open SSE");
    let content_type = response.header("content-type").unwrap_or("").to_string();
    answers.push(json!({"method": "GET", "path": "/v1/sse", "status": response.status(), "content_type": content_type, "body": null}));
    drop(response);

    // The token, publish and history answers above were real successes (not all errors).
    let statuses: BTreeSet<(String, u64)> = answers
        .iter()
        .map(|a| (a["path"].as_str().unwrap().to_string(), a["status"].as_u64().unwrap()))
        .collect();
    for expected in [
        ("/v1/tokens", 201),
        (events, 201),
        (events, 200),
        (state, 200),
        (presence, 200),
        (messages, 201),
        (kick, 200),
        ("/v1/admin/overview", 200),
        ("/admin", 200),
        ("/v1/admin/rebalance", 409),
        ("/v1/admin/rebalance", 400),
        ("/v1/admin/cells", 409),
    ] {
        assert!(
            statuses.contains(&(expected.0.to_string(), expected.1)),
            "no {expected:?} among the answers: {statuses:?}"
        );
    }

    let dir = tempfile::tempdir().unwrap();
    if std::env::var_os("LIVEGATE_OPENAPI_SHOW").is_some() {
        eprintln!("{}", serde_json::to_string_pretty(&answers).unwrap());
    }
    let (ok, output) = check_answers(&doc, &answers, dir.path(), "real");
    assert!(ok, "real answers that /openapi.json does not describe:\n{output}");
    eprintln!("check_answers.py: {}", output.trim());

    // The check can fail: a field the document does not name, a status it does not list,
    // and a wrong type are each reported.
    let token_reply =
        answers.iter().find(|a| a["path"] == "/v1/tokens" && a["status"] == 201).unwrap().clone();
    let mut extra_field = token_reply.clone();
    extra_field["body"]["surprise"] = json!(1);
    let mut undocumented_status = token_reply.clone();
    undocumented_status["status"] = json!(418);
    let mut wrong_type = token_reply;
    wrong_type["body"]["expires_at_ms"] = json!("soon");
    for (name, bad) in
        [("extra-field", extra_field), ("status", undocumented_status), ("type", wrong_type)]
    {
        let (ok, output) = check_answers(&doc, &[bad], dir.path(), name);
        assert!(!ok, "check_answers.py accepted a {name} mismatch:\n{output}");
    }
}
