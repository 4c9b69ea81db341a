//! The test-only echo socket behind `/v1/echo` (config `ws_echo`): every whole message
//! goes back as it came. It runs on the same transport ([`WsIo`]) and reads frames with
//! the same [`MessageReader`], limits and close codes as client connections, so a
//! conformance suite run against it checks livegate's WebSocket handling.

use actix::prelude::*;
use actix_http::ws::{self, CloseCode, CloseReason};

use super::socket::{ends_closing, Inbound, MessageReader, CLOSE_HANDSHAKE_TIMEOUT, FINISH_WITHIN};
use super::wsio::{self, ReadError, WsActor, WsIo};

pub struct EchoSocket {
    io: WsIo,
    reader: MessageReader,
    closing: bool,
    /// Its place in the connection limits, held while the socket lives.
    _permit: Box<dyn Send>,
}

impl EchoSocket {
    pub fn new(io: WsIo, max_message_bytes: usize, permit: Box<dyn Send>) -> Self {
        EchoSocket {
            io,
            reader: MessageReader::new(max_message_bytes),
            closing: false,
            _permit: permit,
        }
    }
}

impl Actor for EchoSocket {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        wsio::drive(ctx);
    }

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        self.io.finish(FINISH_WITHIN);
    }
}

impl WsActor for EchoSocket {
    fn io(&mut self) -> Option<&mut WsIo> {
        Some(&mut self.io)
    }

    fn on_read(&mut self, item: Result<ws::Message, ReadError>, ctx: &mut Self::Context) {
        let read = self.reader.read(item);
        if self.closing {
            if ends_closing(&read) {
                ctx.stop();
            }
            return;
        }
        match read {
            Ok(Inbound::Text(text)) => self.io.text(&text),
            Ok(Inbound::Binary(bytes)) => self.io.binary(&bytes),
            Ok(Inbound::Ping(payload)) => self.io.pong(&payload),
            Ok(Inbound::Nothing) => {}
            Ok(Inbound::Close(reason)) => {
                self.io.close(reason);
                ctx.stop();
            }
            Err(fault) => match fault.close_code() {
                Some(code) => {
                    let reason = CloseReason {
                        code: CloseCode::from(code.code()),
                        description: Some(fault.reason().into()),
                    };
                    self.io.close(Some(reason));
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
}
