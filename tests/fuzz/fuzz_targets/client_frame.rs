//! `protocol::parse_client_frame` on arbitrary text: every input is either a request or a
//! `FrameError`, never a panic. The connection hands the parser whatever a client sent in
//! a text frame, so this is the first thing a hostile client reaches after the upgrade.
//! A publish's `data` and `state` are kept as the client's bytes (issue 29).
#![no_main]

use libfuzzer_sys::fuzz_target;
use livegate::protocol::{parse_client_frame, ClientOp};

fn check(text: &str) {
    match parse_client_frame(text) {
        Ok(request) => {
            // A parsed frame came from a JSON object, so the text is at least `{}`-sized,
            // and its room-carrying ops name the room given in the frame.
            assert!(text.len() >= 2, "parsed {request:?} out of {text:?}");
            if let ClientOp::Subscribe { room, .. } | ClientOp::Unsubscribe { room } | ClientOp::History { room, .. } =
                &request.op
            {
                assert!(text.len() >= room.len(), "room {room:?} longer than the frame {text:?}");
            }
            // A publish keeps `data` and `state` as the client's bytes: slices of the frame.
            if let ClientOp::Publish { data, state, .. } = &request.op {
                assert!(text.contains(data.as_str()), "data {data:?} is not the frame's bytes {text:?}");
                assert!(state.as_deref().is_none_or(|s| text.contains(s)), "state {state:?} is not the frame's bytes {text:?}");
            }
        }
        Err(error) => assert!(!error.message.is_empty(), "empty error message for {text:?}"),
    }
}

fuzz_target!(|data: &[u8]| {
    // Text frames are UTF-8 by the time they reach the parser; try the bytes as they are
    // when they are valid, and always their lossy form (so invalid input still explores).
    if let Ok(text) = std::str::from_utf8(data) {
        check(text);
    }
    check(&String::from_utf8_lossy(data));
});
