//! The server hands out the client library itself: `GET /livegate.js` is the whole client
//! as one minified ES module (the npm package's dist/livegate.min.js), `GET
//! /livegate.iife.js` the same as a classic script (dist/livegate.iife.js), and
//! `GET /livegate/{file}` its readable modules, byte for byte the files of the npm package
//! in clients/js/, served as JavaScript so browsers will run them.

use crate::common;

use common::*;

/// `GET path` on the server: (status, content type, body).
fn get(server: &TestServer, path: &str) -> (u16, String, String) {
    let response = match ureq::get(&format!("http://{}{path}", server.addr)).call() {
        Ok(response) => response,
        Err(ureq::Error::Status(_, response)) => response,
        Err(error) => panic!("GET {path}: {error}"),
    };
    let status = response.status();
    let content_type = response.content_type().to_string();
    (status, content_type, response.into_string().unwrap())
}

#[tokio::test]
async fn livegate_js_is_served_as_an_es_module() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let (status, content_type, body) = get(&server, "/livegate.js");
    assert_eq!(status, 200);
    assert!(content_type.starts_with("text/javascript"), "{content_type}");
    assert_eq!(body, include_str!("../../clients/js/dist/livegate.min.js"));
    assert!(body.contains(" as connect"), "the module exports connect");
    assert!(!body.contains("import "), "one file: it imports nothing");
}

#[tokio::test]
async fn livegate_iife_js_is_served_as_a_classic_script() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let (status, content_type, body) = get(&server, "/livegate.iife.js");
    assert_eq!(status, 200);
    assert!(content_type.starts_with("text/javascript"), "{content_type}");
    assert_eq!(body, include_str!("../../clients/js/dist/livegate.iife.js"));
    assert!(body.contains("var Livegate="), "the script defines the global Livegate");
}

#[tokio::test]
async fn every_module_the_entry_imports_is_served_and_nothing_else() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let dir = std::path::Path::new(REPO).join("clients/js/livegate");
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .expect("clients/js/livegate")
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.ends_with(".js"))
        .collect();
    on_disk.sort();
    let served: Vec<String> =
        livegate::http::CLIENT_MODULES.iter().map(|(name, _)| name.to_string()).collect();
    assert_eq!(
        served, on_disk,
        "the server's table lists every module of clients/js/livegate/, sorted"
    );
    for name in &on_disk {
        let (status, content_type, body) = get(&server, &format!("/livegate/{name}"));
        assert_eq!(status, 200, "GET /livegate/{name}");
        assert!(content_type.starts_with("text/javascript"), "{name}: {content_type}");
        assert_eq!(
            body,
            std::fs::read_to_string(dir.join(name)).unwrap(),
            "/livegate/{name} is the package's file"
        );
    }
    for missing in ["/livegate/nothing.js", "/livegate/..%2Fclient.js", "/livegate/"] {
        let (status, _, _) = get(&server, missing);
        assert_eq!(status, 404, "GET {missing}");
    }
}
