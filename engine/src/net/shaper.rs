//! A link shaper inside the TCP transport, for tests and benchmarks: each
//! connection's outgoing bytes are serialized at `rate` and delivered after
//! `one_way` latency, like a home uplink. The kernel here has no `netem`, so
//! this is where latency can be added. Both ends shape their own sends, so
//! the round trip is twice `one_way`.

use libp2p::futures::{AsyncRead, AsyncWrite};
use libp2p::tcp::tokio::TcpStream;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Link {
    /// Bytes per second; None is unlimited.
    pub rate: Option<f64>,
    pub one_way: Duration,
}

impl Link {
    /// `mbit` megabits per second and a round-trip time of `rtt` between two
    /// shaped ends.
    pub fn new(mbit: f64, rtt: Duration) -> Self {
        Self {
            rate: (mbit > 0.0).then_some(mbit * 1e6 / 8.0),
            one_way: rtt / 2,
        }
    }
    pub fn is_plain(&self) -> bool {
        self.rate.is_none() && self.one_way.is_zero()
    }
}

/// Bytes this process wrote to and read from its TCP connections, every
/// protocol, frame and encryption tag included: what the links carried.
/// Process-wide, so a node's own figure where one node runs per process
/// (`cohort-peer`, which prints them when done).
pub static WIRE_SENT: AtomicU64 = AtomicU64::new(0);
pub static WIRE_RECEIVED: AtomicU64 = AtomicU64::new(0);

fn counted(r: Poll<io::Result<usize>>, total: &AtomicU64) -> Poll<io::Result<usize>> {
    if let Poll::Ready(Ok(n)) = r {
        total.fetch_add(n as u64, Ordering::Relaxed);
    }
    r
}

/// Bytes a connection may have in flight before writes wait: a router's
/// buffer.
const QUEUE_CAP: usize = 4 << 20;
const MAX_SEGMENT: usize = 64 << 10;

struct Shared {
    queued: AtomicUsize,
    waker: Mutex<Option<Waker>>,
}

pub enum Stream {
    Plain(TcpStream),
    Shaped(Shaped),
}

pub struct Shaped {
    read: tokio::net::tcp::OwnedReadHalf,
    tx: Option<mpsc::UnboundedSender<(Instant, Vec<u8>)>>,
    next_free: Instant,
    link: Link,
    shared: Arc<Shared>,
}

impl Stream {
    /// Wraps a connection; must run inside a tokio runtime when shaping.
    pub fn new(s: TcpStream, link: Link) -> Self {
        if link.is_plain() {
            return Stream::Plain(s);
        }
        let (read, mut write) = s.0.into_split();
        let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
        let shared = Arc::new(Shared {
            queued: AtomicUsize::new(0),
            waker: Mutex::new(None),
        });
        let sh = shared.clone();
        tokio::spawn(async move {
            while let Some((at, bytes)) = rx.recv().await {
                tokio::time::sleep_until(at).await;
                if write.write_all(&bytes).await.is_err() {
                    break;
                }
                sh.queued.fetch_sub(bytes.len(), Ordering::AcqRel);
                if let Some(w) = sh.waker.lock().ok().and_then(|mut w| w.take()) {
                    w.wake();
                }
            }
            let _ = write.shutdown().await;
        });
        Stream::Shaped(Shaped {
            read,
            tx: Some(tx),
            next_free: Instant::now(),
            link,
            shared,
        })
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        let r = match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Shaped(s) => {
                let mut rb = tokio::io::ReadBuf::new(buf);
                match tokio::io::AsyncRead::poll_read(Pin::new(&mut s.read), cx, &mut rb) {
                    Poll::Ready(Ok(())) => Poll::Ready(Ok(rb.filled().len())),
                    Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                    Poll::Pending => Poll::Pending,
                }
            }
        };
        counted(r, &WIRE_RECEIVED)
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let s = match self.get_mut() {
            Stream::Plain(s) => return counted(Pin::new(s).poll_write(cx, buf), &WIRE_SENT),
            Stream::Shaped(s) => s,
        };
        let Some(tx) = &s.tx else {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        };
        if s.shared.queued.load(Ordering::Acquire) >= QUEUE_CAP {
            if let Ok(mut w) = s.shared.waker.lock() {
                *w = Some(cx.waker().clone());
            }
            // Re-check: the writer may have drained between load and store.
            if s.shared.queued.load(Ordering::Acquire) >= QUEUE_CAP {
                return Poll::Pending;
            }
        }
        let n = buf.len().min(MAX_SEGMENT);
        let now = Instant::now();
        let start = s.next_free.max(now);
        let serialize = s
            .link
            .rate
            .map_or(Duration::ZERO, |r| Duration::from_secs_f64(n as f64 / r));
        s.next_free = start + serialize;
        let arrival = s.next_free + s.link.one_way;
        s.shared.queued.fetch_add(n, Ordering::AcqRel);
        if tx.send((arrival, buf[..n].to_vec())).is_err() {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        counted(Poll::Ready(Ok(n)), &WIRE_SENT)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            // Queued bytes are "on the wire": the writer task delivers them.
            Stream::Shaped(_) => Poll::Ready(Ok(())),
        }
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_close(cx),
            Stream::Shaped(s) => {
                s.tx = None;
                Poll::Ready(Ok(()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use libp2p::futures::{AsyncReadExt, AsyncWriteExt as _};

    #[tokio::test(flavor = "current_thread")]
    async fn shaped_link_adds_latency_and_limits_rate() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            let mut s = Stream::new(TcpStream(s), Link::default());
            let mut buf = vec![0u8; 250_000];
            s.read_exact(&mut buf).await.unwrap();
            Instant::now()
        });
        let c = tokio::net::TcpStream::connect(addr).await.unwrap();
        // 8 Mbit/s = 1 MB/s: 250 kB takes 250 ms, plus 40 ms one way.
        let mut c = Stream::new(TcpStream(c), Link::new(8.0, Duration::from_millis(80)));
        let t0 = Instant::now();
        c.write_all(&vec![7u8; 250_000]).await.unwrap();
        let took = server.await.unwrap() - t0;
        assert!(took >= Duration::from_millis(280), "{took:?}");
    }
}
