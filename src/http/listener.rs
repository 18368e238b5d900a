//! A TCP listener that serves at most N connections at once; the next waits in the kernel's backlog.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub struct LimitedListener {
    inner: TcpListener,
    permits: Arc<Semaphore>,
}

impl LimitedListener {
    pub fn new(inner: TcpListener, max_connections: usize) -> Self {
        LimitedListener {
            inner,
            permits: Arc::new(Semaphore::new(max_connections.max(1))),
        }
    }
}

/// A connection holding one permit until it is dropped.
pub struct Limited {
    stream: TcpStream,
    _permit: OwnedSemaphorePermit,
}

impl axum::serve::Listener for LimitedListener {
    type Io = Limited;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let permit = match self.permits.clone().acquire_owned().await {
                Ok(p) => p,
                // The semaphore is never closed; if it were, stop accepting rather than spin.
                Err(_) => std::future::pending().await,
            };
            match self.inner.accept().await {
                Ok((stream, addr)) => {
                    let _ = stream.set_nodelay(true);
                    return (
                        Limited {
                            stream,
                            _permit: permit,
                        },
                        addr,
                    );
                }
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning, as axum's own listener does.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

impl AsyncRead for Limited {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Limited {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
