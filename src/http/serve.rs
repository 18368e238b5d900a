//! The HTTP server loop. hyper's HTTP/1 serves each connection with a request deadline: a client gets
//! `request_timeout` to send a request's headers (an idle keep-alive connection waits for its next
//! request under the same deadline), the handler's answer is bounded by it as well, and a response
//! that the client stops reading is dropped when a write makes no progress for that long.
//!
//! At most `max_connections` are open at once. When the table is full, a new connection takes the
//! place of an idle one (no request in flight): first one that never completed a request, oldest
//! first, then the one idle longest. So a flood of slow or idle clients from one user can make a
//! scraper reconnect, never lock it out; only when every connection is inside a handler does a new
//! one wait to be accepted.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::response::IntoResponse;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;
use tokio::time::{Instant, Sleep};
use tower::ServiceExt;

/// The most a connection buffers of a request's head.
const MAX_HEAD_BYTES: usize = 64 * 1024;

/// The server's limits (config `[http]`).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most connections open at once.
    pub max_connections: usize,
    /// Most time a client gets to send a request and to read each part of the answer.
    pub request_timeout: Duration,
}

/// One open connection, as the table sees it.
struct Slot {
    /// Requests answered on it.
    served: AtomicU64,
    /// Requests inside a handler now.
    in_flight: AtomicUsize,
    /// When it was opened or last finished a request.
    idle_since: Mutex<Instant>,
    /// Told to close: another connection needed its place.
    evict: Notify,
    evicted: std::sync::atomic::AtomicBool,
}

impl Slot {
    fn new() -> Self {
        Slot {
            served: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
            evict: Notify::new(),
            evicted: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn idle_since(&self) -> Instant {
        *self.idle_since.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A request inside a handler: counted while it lives, also when its connection is dropped.
struct Busy(Arc<Slot>);

impl Busy {
    fn new(slot: Arc<Slot>) -> Self {
        slot.in_flight.fetch_add(1, Ordering::AcqRel);
        Busy(slot)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        *self.0.idle_since.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        self.0.served.fetch_add(1, Ordering::Relaxed);
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The open connections.
#[derive(Default)]
struct Table {
    slots: Mutex<HashMap<u64, Arc<Slot>>>,
    /// A connection ended.
    freed: Notify,
}

impl Table {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Slot>>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether there is room for one more connection. When the table is full and no connection is
    /// closing yet, the idle one chosen (see the module comment) is told to close; the caller waits for
    /// `freed` and asks again, so the open connections never exceed `max`.
    fn make_room(&self, max: usize) -> bool {
        let slots = self.lock();
        if slots.len() < max {
            return true;
        }
        if slots.values().any(|s| s.evicted.load(Ordering::Acquire)) {
            return false;
        }
        let victim = slots
            .values()
            .filter(|s| s.in_flight.load(Ordering::Acquire) == 0)
            .min_by_key(|s| (s.served.load(Ordering::Relaxed) > 0, s.idle_since()));
        if let Some(slot) = victim {
            slot.evicted.store(true, Ordering::Release);
            slot.evict.notify_one();
        }
        false
    }

    fn remove(&self, id: u64) {
        self.lock().remove(&id);
        self.freed.notify_waiters();
    }
}

/// Serves `app` on `listener` until `stop` resolves; then closes idle connections, lets requests in
/// flight finish (for at most `request_timeout`), and returns.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    stop: impl Future<Output = ()>,
) {
    let table = Arc::new(Table::default());
    let (closing_tx, closing) = watch::channel(false);
    let mut tasks = JoinSet::new();
    let mut next_id = 0u64;
    let mut stop = std::pin::pin!(stop);
    let max = limits.max_connections.max(1);
    'accept: loop {
        let stream = tokio::select! {
            _ = stop.as_mut() => break,
            r = listener.accept() => match r {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        // Room for it: at once, or when an idle connection told to make room has closed, or when a
        // busy one ends (then the next connections wait in the kernel's backlog).
        loop {
            let freed = table.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if table.make_room(max) {
                break;
            }
            tokio::select! {
                _ = stop.as_mut() => break 'accept,
                _ = freed => {}
            }
        }
        let _ = stream.set_nodelay(true);
        let id = next_id;
        next_id += 1;
        let slot = Arc::new(Slot::new());
        table.lock().insert(id, slot.clone());
        let table = table.clone();
        let app = app.clone();
        let closing = closing.clone();
        tasks.spawn(async move {
            connection(stream, app, slot, limits.request_timeout, closing).await;
            table.remove(id);
        });
        // Reap finished tasks so the set stays as small as the table.
        while tasks.try_join_next().is_some() {}
    }
    let _ = closing_tx.send(true);
    let _ = tokio::time::timeout(limits.request_timeout, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
}

/// Serves one connection until it ends, is evicted, or the server closes.
async fn connection(
    stream: TcpStream,
    app: Router,
    slot: Arc<Slot>,
    timeout: Duration,
    mut closing: watch::Receiver<bool>,
) {
    let counted = slot.clone();
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let app = app.clone();
        let slot = counted.clone();
        async move {
            let _busy = Busy::new(slot);
            let answer = tokio::time::timeout(timeout, app.oneshot(req.map(Body::new))).await;
            Ok::<_, std::convert::Infallible>(match answer {
                Ok(Ok(response)) => response,
                Ok(Err(never)) => match never {},
                Err(_) => crate::http::api::error(
                    StatusCode::REQUEST_TIMEOUT,
                    "the request was not read and answered in time",
                )
                .into_response(),
            })
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(timeout)
        // A request's head in at most 64 KiB (hyper's default lets each connection buffer ~400 KiB).
        .max_buf_size(MAX_HEAD_BYTES);
    let conn = builder.serve_connection(TokioIo::new(Stalling::new(stream, timeout)), service);
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                tracing::debug!(error = %e, "HTTP connection ended");
            }
        }
        // Dropping the connection closes it.
        _ = slot.evict.notified() => {}
        _ = closing.changed() => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

/// A TCP stream whose writes fail once they have made no progress for `limit`: a client that stops
/// reading its response does not hold the connection forever.
struct Stalling {
    stream: TcpStream,
    limit: Duration,
    stalled: Option<Pin<Box<Sleep>>>,
}

impl Stalling {
    fn new(stream: TcpStream, limit: Duration) -> Self {
        Stalling {
            stream,
            limit,
            stalled: None,
        }
    }

    /// Called when a write is pending: fails once the stall has lasted `limit`.
    fn check_stall(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        let limit = self.limit;
        let sleep = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client read nothing for the request timeout",
            )),
            Poll::Pending => Poll::Pending,
        }
    }

    fn on_write<T>(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        match r {
            Poll::Pending => self.check_stall(cx).map(Err),
            done => {
                self.stalled = None;
                done
            }
        }
    }
}

impl AsyncRead for Stalling {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Stalling {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.on_write(cx, r)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.stream).poll_flush(cx);
        self.on_write(cx, r)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.stream).poll_shutdown(cx);
        self.on_write(cx, r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// Starts the server on a free port with `max` connections and a 300 ms timeout.
    fn start(max: usize) -> (std::net::SocketAddr, tokio::runtime::Runtime) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = rt.block_on(TcpListener::bind("127.0.0.1:0")).unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new().route("/", axum::routing::get(|| async { "hello" }));
        let limits = Limits {
            max_connections: max,
            request_timeout: Duration::from_millis(300),
        };
        rt.spawn(serve(listener, app, limits, std::future::pending()));
        (addr, rt)
    }

    /// Sends `head`, then reads until the server closes; returns what came and how long it took.
    fn until_closed(addr: std::net::SocketAddr, head: &[u8]) -> (String, Duration) {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let start = std::time::Instant::now();
        s.write_all(head).unwrap();
        let mut got = Vec::new();
        let _ = s.read_to_end(&mut got);
        (String::from_utf8_lossy(&got).into_owned(), start.elapsed())
    }

    #[test]
    fn idle_half_sent_and_kept_alive_connections_are_closed_after_the_timeout() {
        let (addr, _rt) = start(8);
        for head in [
            &b""[..],
            b"GET / HTTP/1.1\r\nHost: x\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        ] {
            let (got, took) = until_closed(addr, head);
            assert!(
                took >= Duration::from_millis(250) && took < Duration::from_secs(5),
                "{head:?}: closed after {took:?}"
            );
            let answered = got.starts_with("HTTP/1.1 200") && got.ends_with("hello");
            assert_eq!(answered, head.ends_with(b"\r\n\r\n"), "{head:?}: {got:?}");
        }
    }

    #[test]
    fn a_full_table_makes_room_by_closing_the_oldest_idle_connection() {
        let (addr, _rt) = start(2);
        let mut idle: Vec<std::net::TcpStream> = (0..2)
            .map(|_| {
                let s = std::net::TcpStream::connect(addr).unwrap();
                std::thread::sleep(Duration::from_millis(30));
                s
            })
            .collect();
        let (got, took) = until_closed(addr, b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n");
        assert!(got.ends_with("hello"), "{got:?}");
        assert!(
            took < Duration::from_millis(250),
            "waited {took:?} for a slot"
        );
        // The oldest idle connection made room: the server closed it.
        idle[0]
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        assert_eq!(idle[0].read(&mut [0u8; 1]).unwrap_or(usize::MAX), 0);
    }
}
