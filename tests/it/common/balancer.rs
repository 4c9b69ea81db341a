//! A small round-robin TCP balancer of the tests' own, like a Kubernetes Service in front
//! of a Deployment: it accepts on `127.0.0.1:0`, connects each accepted socket to the
//! next backend in its list, in turn, and copies bytes both ways until either side ends.
//! The list changes while it runs (a release adds a node once it is ready and removes
//! one when it is told to drain); connections already made stay where they are, as with
//! kube-proxy. A backend that refuses the TCP connection is skipped for that socket (the
//! next one in turn is tried), as a proxy with passive health checks does.
//!
//! It runs on a tokio runtime of its own (one worker thread); dropping it closes the
//! listener and every connection.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};

struct Shared {
    backends: Mutex<Vec<SocketAddr>>,
    cursor: AtomicUsize,
    accepted: AtomicUsize,
    /// Accepted sockets that found no backend to connect to (closed at once).
    unrouted: AtomicUsize,
}

pub struct Balancer {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Balancer {
    /// Listens on `127.0.0.1:0` in front of `backends`.
    pub fn start(backends: &[SocketAddr]) -> Balancer {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("test-balancer")
            .enable_all()
            .build()
            .expect("balancer runtime");
        let shared = Arc::new(Shared {
            backends: Mutex::new(backends.to_vec()),
            cursor: AtomicUsize::new(0),
            accepted: AtomicUsize::new(0),
            unrouted: AtomicUsize::new(0),
        });
        let listener =
            runtime.block_on(TcpListener::bind("127.0.0.1:0")).expect("balancer bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("balancer addr");
        let s = shared.clone();
        runtime.spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else { continue };
                s.accepted.fetch_add(1, Ordering::Relaxed);
                let s = s.clone();
                tokio::spawn(async move { s.forward(client).await });
            }
        });
        Balancer { addr, shared, runtime: Some(runtime) }
    }

    /// `http://127.0.0.1:PORT`: the one address clients are given.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Adds a backend at the end of the list (a node that became ready).
    pub fn add(&self, backend: SocketAddr) {
        let mut backends = self.shared.backends.lock().unwrap();
        if !backends.contains(&backend) {
            backends.push(backend);
        }
    }

    /// Takes a backend out of the list (a node told to drain); its connections stay.
    pub fn remove(&self, backend: SocketAddr) {
        self.shared.backends.lock().unwrap().retain(|b| *b != backend);
    }

    pub fn backends(&self) -> Vec<SocketAddr> {
        self.shared.backends.lock().unwrap().clone()
    }

    /// (sockets accepted, sockets that found no backend) so far.
    pub fn counts(&self) -> (usize, usize) {
        (self.shared.accepted.load(Ordering::Relaxed), self.shared.unrouted.load(Ordering::Relaxed))
    }
}

impl Shared {
    async fn forward(&self, mut client: TcpStream) {
        let _ = client.set_nodelay(true);
        let tries = self.backends.lock().unwrap().len();
        for _ in 0..tries {
            let next = {
                let backends = self.backends.lock().unwrap();
                if backends.is_empty() {
                    break;
                }
                backends[self.cursor.fetch_add(1, Ordering::Relaxed) % backends.len()]
            };
            if let Ok(mut backend) = TcpStream::connect(next).await {
                let _ = backend.set_nodelay(true);
                let _ = tokio::io::copy_bidirectional(&mut client, &mut backend).await;
                return;
            }
        }
        self.unrouted.fetch_add(1, Ordering::Relaxed);
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}
