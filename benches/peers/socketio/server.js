// Socket.IO peer for benches/fanout.rs, run as one Node process pinned to one core.
//
//   node server.js PORT
//
// Clients speak engine.io v4 over a raw WebSocket (/socket.io/?EIO=4&transport=websocket),
// join a room with an acknowledged `join` event and receive every publish as an `ev`
// event. The bench publishes with `POST /pub/ROOM` and a JSON body, which is emitted to
// the room as is. `GET /readyz` answers 200 once listening.
"use strict";
const http = require("http");
const { Server } = require("socket.io");

const port = Number(process.argv[2] || 7090);

const server = http.createServer((req, res) => {
  if (req.method === "GET" && req.url === "/readyz") {
    res.writeHead(200, { "content-type": "text/plain" });
    res.end("ok\n");
    return;
  }
  const m = req.method === "POST" && /^\/pub\/([A-Za-z0-9_.:-]{1,128})$/.exec(req.url);
  if (!m) {
    res.writeHead(404);
    res.end();
    return;
  }
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", () => {
    let data;
    try {
      data = JSON.parse(Buffer.concat(chunks).toString("utf8"));
    } catch (e) {
      res.writeHead(400);
      res.end();
      return;
    }
    io.to(m[1]).emit("ev", data);
    res.writeHead(200, { "content-type": "text/plain" });
    res.end("ok\n");
  });
});
server.keepAliveTimeout = 600000;

const io = new Server(server, {
  transports: ["websocket"],
  serveClient: false,
  perMessageDeflate: false,
  pingInterval: 25000,
  pingTimeout: 60000,
});

io.on("connection", (socket) => {
  socket.on("join", (room, ack) => {
    socket.join(String(room));
    if (typeof ack === "function") ack("ok");
  });
});

server.listen(port, "127.0.0.1", () => {
  console.log(`socketio peer listening on ${port}`);
});
