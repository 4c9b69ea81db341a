//! What both WebSocket actors (client connections and the test-only echo) share: reading
//! whole messages out of the transport's frames — fragments assembled under `max_message_bytes`,
//! text checked for UTF-8 — and the close code each protocol fault ends with.

use actix_http::ws::Item;
use actix_http::ws::{self, CloseReason, ProtocolError};
use actix_web::web::{Bytes, BytesMut};

use super::wsio::ReadError;

use crate::protocol::CloseCode;

/// How long a socket whose Close went out waits for the client's Close.
pub const CLOSE_HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
/// How long a stopped socket may take to write what it still holds (its Close frame).
pub const FINISH_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);

/// Once our Close is out, only the client's Close (or the socket's end) matters: whether
/// this read is one, so the actor stops.
pub fn ends_closing(read: &Result<Inbound, Fault>) -> bool {
    matches!(read, Ok(Inbound::Close(_)) | Err(Fault::Ended))
}

/// One thing read from the socket.
#[derive(Debug)]
pub enum Inbound {
    Text(String),
    Binary(Bytes),
    Ping(Bytes),
    Close(Option<CloseReason>),
    /// A pong, or a fragment of a message not complete yet.
    Nothing,
}

/// Why the socket must close; `Ended` means it already has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    FrameTooBig,
    MessageTooBig,
    InvalidUtf8,
    Protocol,
    Ended,
}

impl Fault {
    /// The close code to send, or `None` when the socket has ended.
    pub fn close_code(self) -> Option<CloseCode> {
        match self {
            Fault::FrameTooBig | Fault::MessageTooBig => Some(CloseCode::TooBig),
            Fault::InvalidUtf8 => Some(CloseCode::InvalidPayload),
            Fault::Protocol => Some(CloseCode::ProtocolError),
            Fault::Ended => None,
        }
    }

    pub fn reason(self) -> &'static str {
        match self {
            Fault::FrameTooBig => "frame too big",
            Fault::MessageTooBig => "message too big",
            Fault::InvalidUtf8 => "text is not valid UTF-8",
            Fault::Protocol => "protocol error",
            Fault::Ended => "socket ended",
        }
    }

    /// Whether the frame stream can no longer be read, so the connection is failed: the
    /// Close frame goes out and the TCP connection ends without waiting for the client's
    /// Close (RFC 6455 §7.1.7).
    pub fn fails_connection(self) -> bool {
        matches!(self, Fault::Protocol | Fault::FrameTooBig)
    }

    /// The abuse limit this fault counts against, if any.
    pub fn limit(self) -> Option<&'static str> {
        match self {
            Fault::FrameTooBig => Some("frame_size"),
            Fault::MessageTooBig => Some("message_size"),
            _ => None,
        }
    }
}

/// Assembles fragmented messages; one per socket.
#[derive(Debug)]
pub struct MessageReader {
    max_message_bytes: usize,
    /// The message being assembled, and whether it is binary.
    fragments: Option<(bool, BytesMut)>,
}

impl MessageReader {
    pub fn new(max_message_bytes: usize) -> Self {
        MessageReader { max_message_bytes, fragments: None }
    }

    pub fn read(&mut self, item: Result<ws::Message, ReadError>) -> Result<Inbound, Fault> {
        let message = match item {
            Ok(message) => message,
            Err(ReadError::Protocol(ProtocolError::Overflow)) => return Err(Fault::FrameTooBig),
            Err(ReadError::InvalidUtf8) => return Err(Fault::InvalidUtf8),
            Err(ReadError::Io(error) | ReadError::Protocol(ProtocolError::Io(error))) => {
                tracing::debug!(%error, "socket ended");
                return Err(Fault::Ended);
            }
            Err(error) => {
                tracing::debug!(%error, "WebSocket protocol error");
                return Err(Fault::Protocol);
            }
        };
        Ok(match message {
            ws::Message::Text(text) => Inbound::Text(text.to_string()),
            ws::Message::Binary(bytes) => Inbound::Binary(bytes),
            ws::Message::Continuation(item) => return self.on_fragment(item),
            ws::Message::Ping(payload) => Inbound::Ping(payload),
            ws::Message::Pong(_) | ws::Message::Nop => Inbound::Nothing,
            ws::Message::Close(reason) => Inbound::Close(reason),
        })
    }

    fn on_fragment(&mut self, item: Item) -> Result<Inbound, Fault> {
        let (first, last, chunk) = match item {
            Item::FirstText(b) => (Some(false), false, b),
            Item::FirstBinary(b) => (Some(true), false, b),
            Item::Continue(b) => (None, false, b),
            Item::Last(b) => (None, true, b),
        };
        if let Some(binary) = first {
            self.fragments = Some((binary, BytesMut::new()));
        }
        let Some((_, buffer)) = self.fragments.as_mut() else { return Err(Fault::Protocol) };
        if buffer.len() + chunk.len() > self.max_message_bytes {
            self.fragments = None;
            return Err(Fault::MessageTooBig);
        }
        buffer.extend_from_slice(&chunk);
        if !last {
            return Ok(Inbound::Nothing);
        }
        let (binary, message) = self.fragments.take().unwrap_or_default();
        if binary {
            return Ok(Inbound::Binary(message.freeze()));
        }
        String::from_utf8(message.to_vec()).map(Inbound::Text).map_err(|_| Fault::InvalidUtf8)
    }
}
