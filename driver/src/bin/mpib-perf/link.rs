//! The control link between the sender and the receiver: the sweep, the 128-byte listen handle,
//! the receiver's numbers per row, the end-of-sweep barrier and failures. Two processes use one
//! TCP connection (frames: a 4-byte big-endian payload length, a kind byte, the payload); one
//! process uses channels between the two threads. The sides do not care which.
//!
//! Every wait is bounded: accepting, connecting (retried while the peer is not up yet) and each
//! read time out with a message naming the peer and what was awaited.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mpib_driver::abi::HANDLE_SIZE;

use crate::sweep::{Fields, Sweep};

/// The receiver's numbers for one row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecvStats {
    /// Row index.
    pub row: usize,
    /// First post to last completion of the timed pass.
    pub elapsed_ns: u64,
    /// Median and 99th percentile `irecv` latency (post to completion).
    pub p50_ns: u64,
    /// See `p50_ns`.
    pub p99_ns: u64,
    /// Payload bytes received (the sizes `test` reported).
    pub bytes: u64,
}

/// One message of the control protocol.
#[derive(Clone, Debug, PartialEq)]
pub enum Msg {
    /// Sender to receiver, first.
    Sweep(Sweep),
    /// Receiver to sender: what `listen` filled.
    Handle([u8; HANDLE_SIZE]),
    /// Receiver to sender, after each row.
    Stats(RecvStats),
    /// Both ways at the end (the barrier), with the number of rows.
    Done(usize),
    /// Either way: the side failed (its message).
    Failed(String),
}

impl Msg {
    fn kind(&self) -> u8 {
        match self {
            Msg::Sweep(_) => b'P',
            Msg::Handle(_) => b'H',
            Msg::Stats(_) => b'R',
            Msg::Done(_) => b'D',
            Msg::Failed(_) => b'E',
        }
    }

    fn payload(&self) -> Vec<u8> {
        match self {
            Msg::Sweep(s) => s.encode().into_bytes(),
            Msg::Handle(h) => h.to_vec(),
            Msg::Stats(s) => format!(
                "row={}\nelapsed_ns={}\np50_ns={}\np99_ns={}\nbytes={}\n",
                s.row, s.elapsed_ns, s.p50_ns, s.p99_ns, s.bytes
            )
            .into_bytes(),
            Msg::Done(rows) => format!("rows={rows}\n").into_bytes(),
            Msg::Failed(m) => m.clone().into_bytes(),
        }
    }

    fn decode(kind: u8, payload: &[u8]) -> Result<Msg, String> {
        let text = || String::from_utf8_lossy(payload).into_owned();
        match kind {
            b'P' => Sweep::decode(&text()).map(Msg::Sweep),
            b'H' => <[u8; HANDLE_SIZE]>::try_from(payload)
                .map(Msg::Handle)
                .map_err(|_| format!("a handle of {} bytes, not {HANDLE_SIZE}", payload.len())),
            b'R' => {
                let text = text();
                let f = Fields::parse(&text)?;
                Ok(Msg::Stats(RecvStats {
                    row: f.number("row")?,
                    elapsed_ns: f.number("elapsed_ns")?,
                    p50_ns: f.number("p50_ns")?,
                    p99_ns: f.number("p99_ns")?,
                    bytes: f.number("bytes")?,
                }))
            }
            b'D' => Fields::parse(&text())?.number("rows").map(Msg::Done),
            b'E' => Ok(Msg::Failed(text())),
            other => Err(format!("a frame of unknown kind {other:#04x}")),
        }
    }
}

/// Either transport.
pub trait Link {
    /// Sends one message.
    fn send(&mut self, msg: &Msg) -> Result<(), String>;
    /// Waits at most `limit` for the next message (`what` names it in the timeout message). A
    /// [`Msg::Failed`] from the peer comes back as an error carrying the peer's message.
    fn recv(&mut self, what: &str, limit: Duration) -> Result<Msg, String>;
    /// Non-blocking: the peer's failure, if it reported one or went away. Cheap enough to call
    /// from a polling loop.
    fn peer_failed(&mut self) -> Option<String>;
    /// Tells the peer this side failed (best effort).
    fn fail(&mut self, message: &str) {
        let _ = self.send(&Msg::Failed(message.to_string()));
    }
}

/// How a side's error starts when it only reports the other side's failure (so a one-process
/// run can show the cause, not the echo).
pub const OTHER_SIDE_FAILED: &str = "the other side failed";

/// Frames bigger than this are not from an mpib-perf peer (the largest is a sweep of 4096 sizes).
const MAX_FRAME: usize = 1 << 20;

/// How often [`TcpLink::peer_failed`] really looks at the socket.
const PEEK_EVERY: Duration = Duration::from_millis(20);

/// One end of the TCP connection.
pub struct TcpLink {
    stream: TcpStream,
    peer: String,
    last_peek: Instant,
}

impl TcpLink {
    /// Sets the connection up; `limit` (`--timeout`) bounds every write.
    fn new(stream: TcpStream, peer: String, limit: Duration) -> Result<TcpLink, String> {
        let setup = stream
            .set_nonblocking(false)
            .and_then(|()| stream.set_nodelay(true))
            .and_then(|()| stream.set_write_timeout(Some(limit)));
        setup.map_err(|e| format!("set up the connection with {peer}: {e}"))?;
        Ok(TcpLink {
            stream,
            peer,
            last_peek: Instant::now(),
        })
    }

    /// The peer's address.
    pub fn peer(&self) -> &str {
        &self.peer
    }

    fn read_frame(&mut self, what: &str, limit: Duration) -> Result<Msg, String> {
        self.stream
            .set_read_timeout(Some(limit.max(Duration::from_millis(1))))
            .map_err(|e| format!("connection with {}: {e}", self.peer))?;
        let mut header = [0u8; 5];
        self.read_exact(&mut header, what, limit)?;
        let len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
        if len > MAX_FRAME {
            return Err(format!(
                "{} is not an mpib-perf peer (it sent a frame of {len} bytes while we waited \
                 for {what})",
                self.peer
            ));
        }
        let mut payload = vec![0u8; len];
        self.read_exact(&mut payload, what, limit)?;
        Msg::decode(header[4], &payload)
            .map_err(|e| format!("{} sent a bad {what}: {e}", self.peer))
    }

    fn read_exact(&mut self, buf: &mut [u8], what: &str, limit: Duration) -> Result<(), String> {
        self.stream.read_exact(buf).map_err(|e| match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => {
                format!("no {what} from {} within {limit:?}", self.peer)
            }
            ErrorKind::UnexpectedEof => format!(
                "{} closed the connection while we waited for {what}",
                self.peer
            ),
            _ => format!("reading {what} from {}: {e}", self.peer),
        })
    }
}

impl Link for TcpLink {
    fn send(&mut self, msg: &Msg) -> Result<(), String> {
        let payload = msg.payload();
        let mut frame = Vec::with_capacity(payload.len() + 5);
        frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        frame.push(msg.kind());
        frame.extend_from_slice(&payload);
        self.stream
            .write_all(&frame)
            .map_err(|e| format!("sending to {}: {e}", self.peer))
    }

    fn recv(&mut self, what: &str, limit: Duration) -> Result<Msg, String> {
        match self.read_frame(what, limit)? {
            Msg::Failed(m) => Err(format!("the peer at {} failed: {m}", self.peer)),
            msg => Ok(msg),
        }
    }

    /// Peeks without consuming: nothing pending is fine; a pending failure frame, an end of file
    /// or a socket error is the peer's failure. Other frames (the receiver's numbers, arriving
    /// while the sender still tests its last requests) stay queued for [`Link::recv`].
    fn peer_failed(&mut self) -> Option<String> {
        if self.last_peek.elapsed() < PEEK_EVERY {
            return None;
        }
        self.last_peek = Instant::now();
        let mut head = [0u8; 5];
        if let Err(e) = self.stream.set_nonblocking(true) {
            return Some(format!("connection with {}: {e}", self.peer));
        }
        let peeked = self.stream.peek(&mut head);
        let _ = self.stream.set_nonblocking(false);
        match peeked {
            Ok(0) => Some(format!("{} closed the connection", self.peer)),
            Ok(5) if head[4] == b'E' => {
                Some(match self.read_frame("its failure", PEEK_EVERY * 50) {
                    Ok(Msg::Failed(m)) => format!("the peer at {} failed: {m}", self.peer),
                    Ok(_) => format!("{} sent a garbled failure", self.peer),
                    Err(e) => e,
                })
            }
            Ok(_) => None,
            Err(e) if e.kind() == ErrorKind::WouldBlock => None,
            Err(e) => Some(format!("connection with {}: {e}", self.peer)),
        }
    }
}

/// Binds `[ADDR:]PORT` (a bare port listens on every IPv4 address).
pub fn bind(spec: &str) -> Result<TcpListener, String> {
    let text = if spec.trim().chars().all(|c| c.is_ascii_digit()) {
        format!("0.0.0.0:{}", spec.trim())
    } else {
        spec.trim().to_string()
    };
    let addrs: Vec<SocketAddr> = text
        .to_socket_addrs()
        .map_err(|e| format!("--listen {spec:?}: not [ADDR:]PORT ({e})"))?
        .collect();
    TcpListener::bind(&addrs[..]).map_err(|e| format!("--listen {spec:?}: cannot bind: {e}"))
}

/// Accepts one connection within `limit`.
pub fn accept(listener: &TcpListener, limit: Duration) -> Result<TcpLink, String> {
    let local = listener
        .local_addr()
        .map_or_else(|_| "?".to_string(), |a| a.to_string());
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("listen on {local}: {e}"))?;
    let start = Instant::now();
    loop {
        match listener.accept() {
            Ok((stream, addr)) => return TcpLink::new(stream, addr.to_string(), limit),
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("accept on {local}: {e}")),
        }
        if start.elapsed() > limit {
            return Err(format!(
                "no peer connected to {local} within {limit:?} (start `mpib-perf --peer \
                 THIS_HOST:PORT` on the sending host, or raise --timeout)"
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The addresses of `--peer HOST:PORT`.
pub fn resolve(spec: &str) -> Result<Vec<SocketAddr>, String> {
    spec.to_socket_addrs()
        .map(Iterator::collect)
        .map_err(|e| format!("--peer {spec:?}: not a reachable HOST:PORT ({e})"))
}

/// Connects to one of `addrs` (`spec` resolved) within `limit`, retrying while nobody listens
/// yet (the two sides may be started in either order).
pub fn connect(spec: &str, addrs: &[SocketAddr], limit: Duration) -> Result<TcpLink, String> {
    let start = Instant::now();
    let mut last = String::from("no address");
    loop {
        for addr in addrs {
            let left = limit.saturating_sub(start.elapsed());
            let attempt = left.clamp(Duration::from_millis(1), Duration::from_secs(2));
            match TcpStream::connect_timeout(addr, attempt) {
                Ok(stream) => return TcpLink::new(stream, addr.to_string(), limit),
                Err(e) => last = e.to_string(),
            }
        }
        if start.elapsed() > limit {
            return Err(format!(
                "--peer {spec}: no mpib-perf --listen answered within {limit:?} (last error: \
                 {last})"
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One end of the in-process link.
pub struct ChanLink {
    tx: mpsc::Sender<Msg>,
    rx: mpsc::Receiver<Msg>,
    said: Arc<Mutex<Option<String>>>,
    heard: Arc<Mutex<Option<String>>>,
}

/// Two connected in-process ends.
pub fn channel_pair() -> (ChanLink, ChanLink) {
    let (a_tx, b_rx) = mpsc::channel();
    let (b_tx, a_rx) = mpsc::channel();
    let (a_said, b_said) = (Arc::default(), Arc::default());
    let a = ChanLink {
        tx: a_tx,
        rx: a_rx,
        said: Arc::clone(&a_said),
        heard: Arc::clone(&b_said),
    };
    let b = ChanLink {
        tx: b_tx,
        rx: b_rx,
        said: b_said,
        heard: a_said,
    };
    (a, b)
}

impl Link for ChanLink {
    fn send(&mut self, msg: &Msg) -> Result<(), String> {
        self.tx
            .send(msg.clone())
            .map_err(|_| "the other side's thread has ended".to_string())
    }

    fn recv(&mut self, what: &str, limit: Duration) -> Result<Msg, String> {
        match self.rx.recv_timeout(limit) {
            Ok(Msg::Failed(m)) => Err(format!("{OTHER_SIDE_FAILED}: {m}")),
            Ok(msg) => Ok(msg),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                Err(format!("no {what} from the other side within {limit:?}"))
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(format!(
                "the other side's thread ended before sending {what}"
            )),
        }
    }

    fn peer_failed(&mut self) -> Option<String> {
        let heard = self.heard.lock().unwrap_or_else(|p| p.into_inner());
        heard.as_ref().map(|m| format!("{OTHER_SIDE_FAILED}: {m}"))
    }

    fn fail(&mut self, message: &str) {
        *self.said.lock().unwrap_or_else(|p| p.into_inner()) = Some(message.to_string());
        let _ = self.send(&Msg::Failed(message.to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_over_tcp() {
        let listener = bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let client = std::thread::spawn(move || {
            let spec = format!("127.0.0.1:{port}");
            let addrs = resolve(&spec).unwrap();
            let mut link = connect(&spec, &addrs, Duration::from_secs(5)).unwrap();
            link.send(&Msg::Handle([7u8; HANDLE_SIZE])).unwrap();
            let stats = RecvStats {
                row: 3,
                elapsed_ns: 10,
                p50_ns: 1,
                p99_ns: 2,
                bytes: 99,
            };
            link.send(&Msg::Stats(stats)).unwrap();
            link.fail("boom");
            link.recv("the end", Duration::from_secs(5))
        });
        let mut server = accept(&listener, Duration::from_secs(5)).unwrap();
        let limit = Duration::from_secs(5);
        assert_eq!(
            server.recv("handle", limit).unwrap(),
            Msg::Handle([7u8; HANDLE_SIZE])
        );
        assert!(matches!(server.recv("stats", limit), Ok(Msg::Stats(s)) if s.bytes == 99));
        std::thread::sleep(PEEK_EVERY * 2);
        let failed = server.peer_failed().unwrap();
        assert!(failed.contains("boom"), "{failed}");
        server.send(&Msg::Done(4)).unwrap();
        assert_eq!(client.join().unwrap(), Ok(Msg::Done(4)));
    }

    #[test]
    fn waits_are_bounded_and_named() {
        let listener = bind("127.0.0.1:0").unwrap();
        let message = accept(&listener, Duration::from_millis(50)).err().unwrap();
        assert!(message.contains("no peer connected"), "{message}");
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let spec = format!("127.0.0.1:{port}");
        let addrs = resolve(&spec).unwrap();
        let message = connect(&spec, &addrs, Duration::from_millis(300))
            .err()
            .unwrap();
        assert!(
            message.contains("no mpib-perf --listen answered"),
            "{message}"
        );
        let (mut a, mut b) = channel_pair();
        assert!(a.recv("x", Duration::from_millis(10)).is_err());
        b.fail("gone");
        assert!(a.peer_failed().unwrap().contains("gone"));
    }
}
