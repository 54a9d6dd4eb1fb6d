//! The metrics endpoint's HTTP side: `GET /metrics` (and `HEAD`), one thread waiting on every
//! scraper at once ([`crate::clients`]), the reply rendered by [`crate::metrics::render`].
//!
//! Served like the collector's endpoint (collector/src/server.rs, hyper on tokio): every
//! connection is read concurrently, a request must arrive within [`SCRAPE_TIMEOUT`] (the
//! collector's header read timeout) and its answer be taken within as long again, and idle
//! connections are closed at that deadline. The agent has no async runtime, so the same rules
//! are kept by a `poll(2)` loop rather than by sharing the collector's server (a shared
//! node-side crate is separate work). Until this version the endpoint served one connection at a
//! time with a 2 s read timeout each: 130 idle connections made a scrape take 6 s.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::io::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::clients::{self, Accepted, Client};
use crate::log;
use crate::metrics::render;
use crate::server::Shared;

/// How long a scraper may take to send its request, and then to take the answer.
pub const SCRAPE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections open at once; a newcomer past it takes the place of the oldest idle one
/// ([`crate::clients`]). A scraper that has sent part of a request keeps its place until its
/// deadline: a request line with no blank line after it is never answered and closed then.
pub const MAX_SCRAPERS: usize = 64;
/// The longest request head read; a longer one is answered 431 and closed.
const MAX_REQUEST: usize = 8192;
/// Content type of the Prometheus text format (as the collector's).
use mpib_node::exposition::CONTENT_TYPE as TEXT_FORMAT;

/// Serves `GET /metrics` until stop.
pub fn serve(listener: TcpListener, shared: Shared, host: String) {
    if let Err(e) = listener.set_nonblocking(true) {
        log::error(&format!("metrics endpoint: cannot set non-blocking: {e}"));
        return;
    }
    let host: Arc<str> = host.into();
    let accept = || match listener.accept() {
        Ok((stream, _)) => {
            stream.set_nonblocking(true)?;
            Ok(Accepted::Client(Scraper {
                stream,
                shared: shared.clone(),
                host: Arc::clone(&host),
                request: Vec::new(),
                reply: Vec::new(),
                written: 0,
                deadline: Instant::now() + SCRAPE_TIMEOUT,
            }))
        }
        Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(Accepted::None),
        Err(e) => Err(e),
    };
    clients::serve(
        "metrics endpoint",
        listener.as_raw_fd(),
        &shared.stop,
        shared.stopping.fd(),
        MAX_SCRAPERS,
        accept,
    );
}

/// One connection: its request head as it arrives, then its reply as it is written.
struct Scraper {
    stream: TcpStream,
    shared: Shared,
    host: Arc<str>,
    request: Vec<u8>,
    /// Empty until the request is whole.
    reply: Vec<u8>,
    written: usize,
    deadline: Instant,
}

impl Scraper {
    /// Reads what has arrived; builds the reply once the head is whole. False when done.
    fn receive(&mut self) -> bool {
        let mut chunk = [0u8; 1024];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => return false,
                Ok(n) => self.request.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return false,
            }
            if let Some(end) = head_end(&self.request) {
                self.reply = self.respond(&self.request[..end]);
                self.deadline = Instant::now() + SCRAPE_TIMEOUT;
                return self.send();
            }
            if self.request.len() > MAX_REQUEST {
                self.reply = reply(431, "text/plain", "request head too long\n", false);
                return self.send();
            }
        }
    }

    /// The reply to a request head.
    fn respond(&self, head: &[u8]) -> Vec<u8> {
        let head = String::from_utf8_lossy(head);
        let mut words = head.lines().next().unwrap_or("").split_whitespace();
        let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
        let path = target.split('?').next().unwrap_or("");
        let with_body = method != "HEAD";
        match (method, path) {
            ("GET" | "HEAD", "/metrics") => {
                let body = {
                    let policies = self.shared.policies.load();
                    render(&self.shared.lock(), &policies, &self.host)
                };
                reply(200, TEXT_FORMAT, &body, with_body)
            }
            ("GET" | "HEAD", "/") => reply(
                200,
                "text/plain; charset=utf-8",
                "mpib-agent: metrics at /metrics\n",
                with_body,
            ),
            ("GET" | "HEAD", _) => reply(
                404,
                "text/plain; charset=utf-8",
                "not found; metrics are at /metrics\n",
                with_body,
            ),
            _ => reply(
                405,
                "text/plain; charset=utf-8",
                "only GET and HEAD\n",
                true,
            ),
        }
    }

    /// Writes what the socket takes; false once the reply is out (or the client is gone).
    fn send(&mut self) -> bool {
        while self.written < self.reply.len() {
            match self.stream.write(&self.reply[self.written..]) {
                Ok(0) => return false,
                Ok(n) => self.written += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
        false
    }
}

impl Client for Scraper {
    fn fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }

    fn events(&self) -> i16 {
        if self.reply.is_empty() {
            libc::POLLIN
        } else {
            libc::POLLOUT
        }
    }

    fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Nothing of a request yet: a scraper mid-request or mid-reply is not evicted.
    fn idle(&self) -> bool {
        self.request.is_empty() && self.reply.is_empty()
    }

    fn answering(&self) -> bool {
        !self.reply.is_empty()
    }

    fn ready(&mut self) -> bool {
        if self.reply.is_empty() {
            self.receive()
        } else {
            self.send()
        }
    }

    fn timed_out(&mut self) {}

    fn evicted(&mut self) {}
}

/// Where the request head ends (after its blank line), if it has.
fn head_end(request: &[u8]) -> Option<usize> {
    let crlf = request
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|at| at + 4);
    let lf = request
        .windows(2)
        .position(|w| w == b"\n\n")
        .map(|at| at + 2);
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// An HTTP/1.1 reply that closes the connection.
fn reply(status: u16, content_type: &str, body: &str, with_body: bool) -> Vec<u8> {
    let reason = match status {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Request Header Fields Too Large",
    };
    let mut text = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    if with_body {
        text.push_str(body);
    }
    text.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::{head_end, reply};

    #[test]
    fn a_head_ends_at_its_blank_line_and_replies_carry_their_length() {
        assert_eq!(
            head_end(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\nrest"),
            Some(34)
        );
        assert_eq!(head_end(b"GET / HTTP/1.0\n\n"), Some(16));
        assert_eq!(head_end(b"GET /metrics HTTP/1.0\r\nHost: x\r\n"), None);
        let text = String::from_utf8(reply(200, "text/plain", "abc\n", false)).unwrap_or_default();
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
        assert!(text.contains("Content-Length: 4\r\n"), "{text}");
        assert!(text.ends_with("\r\n\r\n"), "HEAD: no body: {text}");
    }
}
