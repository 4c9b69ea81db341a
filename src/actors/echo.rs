//! The test-only echo socket behind `/v1/echo` (config `ws_echo`): every whole message
//! goes back as it came. It reads frames with the same [`MessageReader`], limits and
//! close codes as client connections, so a conformance suite run against it checks
//! livegate's WebSocket handling.

use actix::prelude::*;
use actix_web_actors::ws::{self, CloseCode, CloseReason};

use super::backlog::SocketAbort;
use super::socket::{ends_closing, Inbound, MessageReader, CLOSE_HANDSHAKE_TIMEOUT};

pub struct EchoSocket {
    reader: MessageReader,
    closing: bool,
    /// Its place in the connection limits, held while the socket lives.
    _permit: Box<dyn Send>,
    socket: Option<std::sync::Weak<SocketAbort>>,
}

impl EchoSocket {
    pub fn new(max_message_bytes: usize, permit: Box<dyn Send>, socket: Option<std::sync::Weak<SocketAbort>>) -> Self {
        EchoSocket { reader: MessageReader::new(max_message_bytes), closing: false, _permit: permit, socket }
    }
}

impl Actor for EchoSocket {
    type Context = ws::WebsocketContext<Self>;

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        if let Some(socket) = self.socket.as_ref().and_then(std::sync::Weak::upgrade) {
            socket.finish_reading();
        }
    }
}

impl StreamHandler<Result<ws::Message, ws::ProtocolError>> for EchoSocket {
    fn handle(&mut self, item: Result<ws::Message, ws::ProtocolError>, ctx: &mut Self::Context) {
        let read = self.reader.read(item);
        if self.closing {
            if ends_closing(&read) {
                ctx.stop();
            }
            return;
        }
        match read {
            Ok(Inbound::Text(text)) => ctx.text(text),
            Ok(Inbound::Binary(bytes)) => ctx.binary(bytes),
            Ok(Inbound::Ping(payload)) => ctx.pong(&payload),
            Ok(Inbound::Nothing) => {}
            Ok(Inbound::Close(reason)) => {
                ctx.close(reason);
                ctx.stop();
            }
            Err(fault) => match fault.close_code() {
                Some(code) => {
                    let reason = CloseReason { code: CloseCode::from(code), description: Some(fault.reason().into()) };
                    ctx.close(Some(reason));
                    self.closing = true;
                    if fault.fails_connection() {
                        ctx.stop();
                    } else {
                        ctx.run_later(CLOSE_HANDSHAKE_TIMEOUT, |_, ctx| ctx.stop());
                    }
                }
                None => ctx.stop(),
            },
        }
    }

    fn finished(&mut self, ctx: &mut Self::Context) {
        ctx.stop();
    }
}
