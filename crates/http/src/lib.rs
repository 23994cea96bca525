//! Serving HTTP/1 with bounds, for the server's API and for each attempt's
//! metadata endpoint on a node.
//!
//! The problem: `axum::serve` sets no timer, so a client that opens a
//! connection and never finishes its request head holds it (and a file
//! descriptor) for ever; thousands of them from one address, no token
//! needed, leave the server unable to accept anyone (`EMFILE`), and a job
//! that does the same to its own endpoint exhausts its root agent's.
//!
//! What this adds, and nothing else (routing stays axum's):
//!
//! * **a header-read timeout** (hyper's `header_read_timeout`, with a
//!   tokio timer): a request's head must arrive within it, counted from
//!   when the connection is ready for the next request — its opening, or
//!   the end of the previous response. So it is also the idle timeout of
//!   a kept-alive connection. A request being answered (a long poll, a
//!   stream) is not idle and is not cut;
//! * **a bound on connections per client address**, and one on all the
//!   connections of the listener: a connection over either is closed as
//!   soon as it is accepted, so it holds no descriptor, and the others
//!   (other addresses, `/healthz` from a load balancer) are served as
//!   before;
//! * graceful shutdown: on the signal, no new connection is accepted and
//!   those open finish their request in flight.
//!
//! And one thing of the other direction: [`outbound`], where the server's
//! own requests (a registry at submit, a webhook) may connect.

pub mod causes;
pub mod outbound;

pub use outbound::Outbound;

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::Request;
use axum::serve::Listener;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::watch;

/// How connections are bounded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// A request's head (request line and headers) must arrive within
    /// this, from when the connection is ready for it; also how long a
    /// kept-alive connection may sit idle.
    pub header_read_timeout: Duration,
    /// Connections open at once from one client address; 0: no bound.
    pub per_address: usize,
    /// Connections open at once in all; 0: no bound.
    pub total: usize,
}

/// Counts of open connections, by client address and in all.
#[derive(Default)]
struct Open {
    by_address: HashMap<IpAddr, usize>,
    total: usize,
}

/// One open connection's place in the counts, given back when dropped.
struct Slot {
    open: Arc<Mutex<Open>>,
    address: IpAddr,
}

impl Slot {
    /// A place for a connection from `address`, if the limits allow one.
    fn take(open: &Arc<Mutex<Open>>, address: IpAddr, limits: &Limits) -> Option<Slot> {
        let mut counts = open.lock().expect("connection counts");
        let from_address = counts.by_address.get(&address).copied().unwrap_or(0);
        let over_address = limits.per_address > 0 && from_address >= limits.per_address;
        let over_total = limits.total > 0 && counts.total >= limits.total;
        if over_address || over_total {
            return None;
        }
        counts.total += 1;
        *counts.by_address.entry(address).or_default() += 1;
        Some(Slot { open: open.clone(), address })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut counts = self.open.lock().expect("connection counts");
        counts.total -= 1;
        if let Some(n) = counts.by_address.get_mut(&self.address) {
            *n -= 1;
            if *n == 0 {
                counts.by_address.remove(&self.address);
            }
        }
    }
}

/// A listener whose connections come from socket addresses.
pub trait Peer {
    fn ip(&self) -> IpAddr;
}

impl Peer for SocketAddr {
    fn ip(&self) -> IpAddr {
        SocketAddr::ip(self)
    }
}

/// Serves `service` (an axum `Router`, or a service of one's own in
/// front of one) on `listener` under `limits` until `shutdown` resolves:
/// then no connection is accepted, and each open one ends once its
/// request in flight is answered (the tasks serving them go on after this
/// returns).
pub async fn serve<L, S>(
    mut listener: L,
    service: S,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send,
) where
    L: Listener,
    L::Addr: Peer,
    S: tower_service::Service<Request<Incoming>, Response = axum::response::Response, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let open = Arc::new(Mutex::new(Open::default()));
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::pin!(shutdown);
    // Refused connections, counted for one warning a minute at most.
    let mut refused: u64 = 0;
    let mut warned_at: Option<tokio::time::Instant> = None;
    loop {
        let (io, peer) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let address = peer.ip();
        let Some(slot) = Slot::take(&open, address, &limits) else {
            drop(io);
            refused += 1;
            if warned_at.is_none_or(|at| at.elapsed() >= Duration::from_secs(60)) {
                tracing::warn!(
                    %address,
                    refused,
                    per_address = limits.per_address,
                    total = limits.total,
                    "connections over the limit closed at once"
                );
                warned_at = Some(tokio::time::Instant::now());
                refused = 0;
            }
            continue;
        };
        let service = TowerToHyperService::new(service.clone());
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder.timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
            let conn = builder.serve_connection(TokioIo::new(io), service);
            tokio::pin!(conn);
            tokio::select! {
                result = conn.as_mut() => {
                    if let Err(e) = result {
                        tracing::debug!(%address, "connection ended: {e}");
                    }
                    return;
                }
                _ = stop.wait_for(|stop| *stop) => conn.as_mut().graceful_shutdown(),
            }
            let _ = conn.await;
        });
    }
    let _ = stop_tx.send(true);
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpSocket, TcpStream};

    async fn server(limits: Limits) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = axum::Router::new().route("/", get(|| async { "ok" }));
        tokio::spawn(serve(listener, router, limits, std::future::pending()));
        addr
    }

    /// A connection from `from` (a loopback address of its own).
    async fn connect(from: &str, to: SocketAddr) -> TcpStream {
        let socket = TcpSocket::new_v4().unwrap();
        socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
        socket.connect(to).await.unwrap()
    }

    /// Whether the server closed `stream` (reading gives EOF or an error).
    async fn closed(stream: &mut TcpStream, within: Duration) -> bool {
        let mut buf = [0u8; 64];
        match tokio::time::timeout(within, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => true,
            Ok(Ok(_)) | Err(_) => false,
        }
    }

    async fn get_ok(from: &str, to: SocketAddr) -> bool {
        let mut stream = connect(from, to).await;
        stream.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").await.unwrap();
        let mut answer = String::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut answer)).await;
        answer.starts_with("HTTP/1.1 200")
    }

    #[tokio::test]
    async fn an_unfinished_request_head_is_closed_at_the_timeout_and_a_finished_one_is_answered() {
        let limits = Limits { header_read_timeout: Duration::from_millis(300), per_address: 0, total: 0 };
        let addr = server(limits).await;
        let mut slow = connect("127.0.0.1", addr).await;
        slow.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n").await.unwrap();
        assert!(!closed(&mut slow, Duration::from_millis(100)).await, "closed before the timeout");
        assert!(closed(&mut slow, Duration::from_secs(5)).await, "an unfinished head was kept open");
        assert!(get_ok("127.0.0.1", addr).await);
    }

    #[tokio::test]
    async fn an_idle_kept_alive_connection_is_closed_at_the_timeout() {
        let limits = Limits { header_read_timeout: Duration::from_millis(300), per_address: 0, total: 0 };
        let addr = server(limits).await;
        let mut stream = connect("127.0.0.1", addr).await;
        stream.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n").await.unwrap();
        let mut buf = [0u8; 256];
        let n = stream.read(&mut buf).await.unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
        assert!(closed(&mut stream, Duration::from_secs(5)).await, "an idle connection was kept open");
    }

    #[tokio::test]
    async fn connections_over_an_addresss_bound_are_closed_and_other_addresses_are_served() {
        let limits = Limits { header_read_timeout: Duration::from_secs(30), per_address: 4, total: 0 };
        let addr = server(limits).await;
        let mut held = Vec::new();
        for _ in 0..4 {
            let mut stream = connect("127.0.0.2", addr).await;
            stream.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
            held.push(stream);
        }
        let mut over = connect("127.0.0.2", addr).await;
        assert!(closed(&mut over, Duration::from_secs(5)).await, "a fifth connection was kept");
        assert!(!get_ok("127.0.0.2", addr).await, "the address over its bound was served");
        assert!(get_ok("127.0.0.1", addr).await, "another address was refused");
        // Slots are given back as connections close.
        held.truncate(3);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(get_ok("127.0.0.2", addr).await, "a slot was not given back");
    }

    #[tokio::test]
    async fn connections_over_the_total_bound_are_closed() {
        let limits = Limits { header_read_timeout: Duration::from_secs(30), per_address: 0, total: 2 };
        let addr = server(limits).await;
        let a = connect("127.0.0.1", addr).await;
        let b = connect("127.0.0.3", addr).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut c = connect("127.0.0.4", addr).await;
        assert!(closed(&mut c, Duration::from_secs(5)).await);
        drop((a, b));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(get_ok("127.0.0.4", addr).await);
    }
}
