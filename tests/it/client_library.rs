//! The server hands out the client library itself: `GET /livegate.js` is the ES module
//! from src/web/livegate.js, served as JavaScript so browsers will run it.

use crate::common;

use common::*;

#[tokio::test]
async fn livegate_js_is_served_as_an_es_module() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let response = ureq::get(&format!("http://{}/livegate.js", server.addr)).call().expect("GET /livegate.js");
    assert_eq!(response.status(), 200);
    assert!(response.content_type().starts_with("text/javascript"), "{}", response.content_type());
    let body = response.into_string().unwrap();
    assert_eq!(body, include_str!("../../src/web/livegate.js"));
    assert!(body.contains("export function connect("));
}
