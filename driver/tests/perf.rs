//! `mpib-perf` through its built binary, on the loopback fabric: the verified one-process sweep
//! (every row's bytes, the rails summing to them), the SUP split sweep, the two-process TCP
//! handshake and its bounded failures, the refusal of libraries that are not plugins and of
//! ABIs it cannot drive, and the CSV output.
//!
//! The plugin is the one built for this profile in this target dir (`cargo build -p mpib`, or
//! `cargo test --workspace`); each run gets a private probes directory. Every child is killed
//! and the test fails if it runs past its limit: the tool must never hang.
#![allow(clippy::unwrap_used, clippy::expect_used)] // A failed unwrap fails the test, with its message.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mpib_driver::plugin::current_profile;

const LIMIT: Duration = Duration::from_secs(30);

fn plugin() -> PathBuf {
    mpib_driver::locate_built_plugin(&current_profile())
        .unwrap_or_else(|e| panic!("build the plugin first (cargo build -p mpib): {e}"))
}

/// A running `mpib-perf`: stdout lines arrive on a channel (to read a port while it runs).
struct Run {
    child: Child,
    lines: mpsc::Receiver<String>,
    stdout: Option<JoinHandle<String>>,
    stderr: Option<JoinHandle<String>>,
    probes: PathBuf,
}

/// What a finished run did.
struct Outcome {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    elapsed: Duration,
}

impl Outcome {
    fn describe(&self) -> String {
        format!(
            "exit {:?} after {:?}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.elapsed, self.stdout, self.stderr
        )
    }
}

fn spawn(args: &[&str]) -> Run {
    let probes = mpib_driver::temp_dir("mpib-perf-test-probes").unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_mpib-perf"));
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("MPIB_") {
            command.env_remove(name);
        }
    }
    let mut child = command
        .args(args)
        .env("MPIB_FABRIC", "loopback")
        .env("MPIB_PROBES", "1")
        .env("MPIB_PROBES_DIR", &probes)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start mpib-perf");
    let (tx, lines) = mpsc::channel();
    let out = child.stdout.take().expect("piped");
    let stdout = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(line.clone());
            all += &line;
            all.push('\n');
        }
        all
    });
    let mut err = child.stderr.take().expect("piped");
    let stderr = std::thread::spawn(move || {
        let mut all = String::new();
        let _ = err.read_to_string(&mut all);
        all
    });
    Run {
        child,
        lines,
        stdout: Some(stdout),
        stderr: Some(stderr),
        probes,
    }
}

impl Run {
    /// Waits for a stdout line containing `needle`.
    fn line_with(&self, needle: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(_) => {}
                Err(_) => panic!("no stdout line with {needle:?} within {limit:?}"),
            }
        }
    }

    fn finish(mut self, limit: Duration) -> Outcome {
        let start = Instant::now();
        let code = loop {
            match self.child.try_wait().expect("wait") {
                Some(status) => break status.code(),
                None if start.elapsed() > limit => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    panic!("mpib-perf did not finish within {limit:?}: it hung");
                }
                None => std::thread::sleep(Duration::from_millis(10)),
            }
        };
        let take = |h: &mut Option<JoinHandle<String>>| {
            h.take().and_then(|h| h.join().ok()).unwrap_or_default()
        };
        Outcome {
            code,
            stdout: take(&mut self.stdout),
            stderr: take(&mut self.stderr),
            elapsed: start.elapsed(),
        }
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.probes);
    }
}

fn perf(args: &[&str]) -> Outcome {
    spawn(args).finish(LIMIT)
}

/// Runs with the built plugin and expects success.
fn perf_ok(args: &[&str]) -> Outcome {
    let path = plugin();
    let mut all = vec!["--plugin", path.to_str().expect("utf-8 path")];
    all.extend_from_slice(args);
    let outcome = perf(&all);
    assert_eq!(outcome.code, Some(0), "{}", outcome.describe());
    outcome
}

/// A flat JSON object of numbers, `null` and booleans (all `mpib-perf --json` writes).
fn parse_row(line: &str) -> Vec<(String, Option<f64>)> {
    let body = line
        .strip_prefix('{')
        .and_then(|l| l.strip_suffix('}'))
        .unwrap_or_else(|| panic!("not a JSON object: {line}"));
    body.split(',')
        .map(|pair| {
            let (key, value) = pair.split_once(':').expect("key:value");
            let key = key.trim_matches('"').to_string();
            let value = match value {
                "null" => None,
                "true" => Some(1.0),
                "false" => Some(0.0),
                v => Some(v.parse::<f64>().unwrap_or_else(|_| panic!("{key}: {v}"))),
            };
            (key, value)
        })
        .collect()
}

fn field(row: &[(String, Option<f64>)], key: &str) -> Option<f64> {
    row.iter()
        .find(|(k, _)| k == key)
        .unwrap_or_else(|| panic!("no field {key}"))
        .1
}

fn int(row: &[(String, Option<f64>)], key: &str) -> u64 {
    field(row, key).unwrap_or_else(|| panic!("{key} is null")) as u64
}

#[test]
fn one_process_verified_sweep_moves_every_byte_on_the_rails() {
    let outcome = perf_ok(&[
        "--max-size",
        "1M",
        "--verify",
        "--json",
        "--iters",
        "20",
        "--warmup",
        "2",
    ]);
    let rows: Vec<_> = outcome.stdout.lines().map(parse_row).collect();
    let sizes: Vec<u64> = rows.iter().map(|r| int(r, "size")).collect();
    assert_eq!(sizes, (3..=20).map(|p| 1u64 << p).collect::<Vec<_>>());
    for row in &rows {
        let (size, count) = (int(row, "size"), int(row, "count"));
        assert_eq!(count, 20);
        assert_eq!(int(row, "bytes"), size * count, "{row:?}");
        assert_eq!(int(row, "sout_bytes") + int(row, "sup_bytes"), size * count);
        assert_eq!(int(row, "verified"), 1);
        assert_eq!(field(row, "sup_bw"), None);
        assert!(field(row, "gbps").is_some_and(|g| g > 0.0), "{row:?}");
        assert!(field(row, "p99_us") >= field(row, "p50_us"), "{row:?}");
    }
    assert!(
        outcome.stderr.contains("ncclNetPlugin_v12"),
        "{}",
        outcome.stderr
    );
}

#[test]
fn split_sweep_rows_show_the_sup_share() {
    let outcome = perf_ok(&[
        "--sup-bw",
        "0,512,1024",
        "--min-size",
        "1M",
        "--max-size",
        "4M",
        "--iters",
        "8",
        "--warmup",
        "1",
        "--json",
    ]);
    let rows: Vec<_> = outcome.stdout.lines().map(parse_row).collect();
    assert_eq!(rows.len(), 9, "{}", outcome.describe());
    for row in &rows {
        let (size, count) = (int(row, "size"), int(row, "count"));
        let share = int(row, "sup_bw") as u32;
        let (sout, sup) = mpib_driver::expected_split(size as usize, share);
        assert_eq!(
            (int(row, "sout_bytes"), int(row, "sup_bytes")),
            (sout as u64 * count, sup as u64 * count),
            "{row:?}"
        );
        let measured = field(row, "sup_share").expect("a share");
        assert!((measured - f64::from(share)).abs() <= 1.0, "{row:?}");
    }
}

#[test]
fn several_connections_move_each_row_together_in_one_row() {
    let outcome = perf_ok(&[
        "--comms",
        "3",
        "--sup-bw",
        "512",
        "--min-size",
        "1M",
        "--max-size",
        "1M",
        "--iters",
        "8",
        "--warmup",
        "1",
        "--repeat",
        "2",
        "--verify",
        "--json",
    ]);
    let rows: Vec<_> = outcome.stdout.lines().map(parse_row).collect();
    assert_eq!(
        rows.len(),
        2,
        "one row per repetition: {}",
        outcome.describe()
    );
    for row in &rows {
        assert_eq!(
            int(row, "bytes"),
            (3 * 8) << 20,
            "all three connections: {row:?}"
        );
        assert_eq!(int(row, "count"), 24);
        assert_eq!(
            int(row, "sout_bytes") + int(row, "sup_bytes"),
            (3 * 8) << 20
        );
        assert_eq!(int(row, "sup_bytes"), (3 * 8) << 19, "each split at 512");
    }
    assert!(field(&rows[1], "at_ms") > field(&rows[0], "at_ms"));
    // The wall clock moves with at_ms, from the epoch: what lines processes up in scripts/perf.
    let number = |row: &[(String, Option<f64>)], key| field(row, key).expect(key);
    let wall = number(&rows[1], "unix_ms") - number(&rows[0], "unix_ms");
    let own = number(&rows[1], "at_ms") - number(&rows[0], "at_ms");
    assert!(number(&rows[0], "unix_ms") > 1.7e12, "{:?}", rows[0]);
    assert!(
        (wall - own).abs() < 1000.0,
        "wall {wall} ms, at_ms {own} ms"
    );
    assert!(
        outcome.stderr.contains("3 connections"),
        "{}",
        outcome.stderr
    );
    let refused = perf(&["--comms", "2", "--peer", "127.0.0.1:1"]);
    assert_eq!(refused.code, Some(2));
    assert!(refused.stderr.contains("--comms 2"), "{}", refused.stderr);
}

#[test]
fn grouped_receives_and_an_older_abi() {
    let outcome = perf_ok(&[
        "--abi",
        "8",
        "--group",
        "4",
        "--verify",
        "--max-size",
        "64K",
        "--iters",
        "5",
        "--json",
    ]);
    let rows: Vec<_> = outcome.stdout.lines().map(parse_row).collect();
    // 8 B ... 64 KiB: 14 sizes; an empty output must not pass.
    assert_eq!(rows.len(), 14, "{}", outcome.describe());
    for row in rows {
        assert_eq!(int(&row, "group"), 4);
        assert_eq!(int(&row, "bytes"), int(&row, "size") * 5 * 4, "{row:?}");
        // What the plugin's probes counted on the rails: every message of every group.
        assert_eq!(
            int(&row, "sout_bytes") + int(&row, "sup_bytes"),
            int(&row, "size") * 5 * 4,
            "{row:?}"
        );
    }
    assert!(
        outcome.stderr.contains("ncclNetPlugin_v8"),
        "{}",
        outcome.stderr
    );
}

#[test]
fn csv_has_a_header_and_rows_that_parse() {
    let outcome = perf_ok(&["--csv", "--max-size", "4K", "--iters", "5"]);
    let mut lines = outcome.stdout.lines();
    let header: Vec<&str> = lines.next().expect("a header").split(',').collect();
    assert_eq!(&header[..3], ["sup_bw", "size", "count"]);
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 10, "{}", outcome.describe());
    for row in &rows {
        assert_eq!(row.len(), header.len(), "{row:?}");
        for (name, value) in header.iter().zip(row).skip(1) {
            let parsed = value.parse::<f64>().is_ok() || ["true", "false"].contains(value);
            assert!(parsed, "{name} = {value:?}");
        }
    }
    assert!(
        outcome.stderr.contains("# mpib-perf: plugin"),
        "{}",
        outcome.stderr
    );
}

#[test]
fn a_library_that_is_not_a_plugin_is_refused() {
    let libc = "/lib/x86_64-linux-gnu/libc.so.6";
    let outcome = perf(&["--plugin", libc, "--max-size", "8"]);
    assert_eq!(outcome.code, Some(2), "{}", outcome.describe());
    assert!(outcome.stderr.contains(libc), "{}", outcome.stderr);
    assert!(
        outcome.stderr.contains("no ncclNetPlugin_v* symbol"),
        "{}",
        outcome.stderr
    );
    let missing = perf(&["--plugin", "/nonexistent/libnccl-net-x.so"]);
    assert_eq!(missing.code, Some(2), "{}", missing.describe());
    assert!(missing.stderr.contains("/nonexistent/libnccl-net-x.so"));
}

#[test]
fn abis_and_flags_it_cannot_take_are_named() {
    for (args, words) in [
        (&["--abi", "6"][..], &["--abi", "ncclNetPlugin_v6"][..]),
        (&["--abi", "13"], &["ncclNetPlugin_v13"]),
        (&["--max-size", "1X"], &["--max-size", "1X"]),
        (&["--sup-bw", "1025"], &["--sup-bw", "1025"]),
        (&["--nope"], &["--nope"]),
    ] {
        let outcome = perf(args);
        assert_eq!(outcome.code, Some(2), "{args:?}: {}", outcome.describe());
        for word in words {
            assert!(
                outcome.stderr.contains(word),
                "{args:?}: {}",
                outcome.stderr
            );
        }
    }
    let help = perf(&["--help"]);
    assert_eq!(help.code, Some(0));
    assert!(help.stdout.contains("usage: mpib-perf"));
}

fn port_of(line: &str) -> u16 {
    let rest = line.split("127.0.0.1:").nth(1).expect("an address");
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().expect("a port")
}

#[test]
fn two_processes_time_out_clearly_without_a_peer() {
    let port = mpib_testkit::free_port().to_string();
    let peer = perf(&["--peer", &format!("127.0.0.1:{port}"), "--timeout", "1"]);
    assert_eq!(peer.code, Some(1), "{}", peer.describe());
    assert!(peer
        .stderr
        .contains("no mpib-perf --listen answered within 1s"));
    let listen = spawn(&["--listen", "127.0.0.1:0", "--timeout", "1"]);
    let line = listen.line_with("listening on", LIMIT);
    assert_ne!(port_of(&line), 0);
    let outcome = listen.finish(LIMIT);
    assert_eq!(outcome.code, Some(1), "{}", outcome.describe());
    assert!(outcome.stderr.contains("no peer connected to 127.0.0.1:"));
}

#[test]
fn the_listener_refuses_a_stranger() {
    let listen = spawn(&["--listen", "127.0.0.1:0", "--timeout", "5"]);
    let port = port_of(&listen.line_with("listening on", LIMIT));
    let mut stranger = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stranger.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let outcome = listen.finish(LIMIT);
    assert_eq!(outcome.code, Some(1), "{}", outcome.describe());
    assert!(
        outcome.stderr.contains("is not an mpib-perf peer"),
        "{}",
        outcome.stderr
    );
}

/// The sender's side of the handshake against a stand-in receiver: it ships the sweep first,
/// then a receiver's failure ends it at once with the receiver's message.
#[test]
fn the_sender_ships_the_sweep_and_reports_the_receivers_failure() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let address = format!("127.0.0.1:{port}");
    let sender = spawn(&[
        "--peer",
        &address,
        "--verify",
        "--max-size",
        "64",
        "--timeout",
        "5",
    ]);
    let (mut stream, _) = listener.accept().unwrap();
    stream.set_read_timeout(Some(LIMIT)).unwrap();
    let mut header = [0u8; 5];
    stream.read_exact(&mut header).unwrap();
    let len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
    let mut payload = vec![0u8; len];
    stream.read_exact(&mut payload).unwrap();
    let sweep = String::from_utf8(payload).unwrap();
    assert_eq!(header[4], b'P');
    for line in [
        "protocol=mpib-perf/1",
        "sizes=8,16,32,64",
        "verify=1",
        "window=8",
    ] {
        assert!(sweep.lines().any(|l| l == line), "{line} in {sweep}");
    }
    let reason = b"stand-in receiver refuses";
    let mut frame = (reason.len() as u32).to_be_bytes().to_vec();
    frame.push(b'E');
    frame.extend_from_slice(reason);
    stream.write_all(&frame).unwrap();
    let outcome = sender.finish(LIMIT);
    assert_eq!(outcome.code, Some(1), "{}", outcome.describe());
    assert!(
        outcome.stderr.contains("stand-in receiver refuses"),
        "{}",
        outcome.stderr
    );
}

/// Two real processes on the loopback fabric: the TCP handshake, the sweep, the handle and the
/// plugin's own connect/accept all cross the process boundary. The loopback fabric itself lives
/// in one process, so the data path cannot work here (the rig's verbs rails carry it); whatever
/// the plugin does with it, both processes must end within their bounds.
#[test]
fn two_processes_on_loopback_connect_and_stay_bounded() {
    let path = plugin();
    let path = path.to_str().expect("utf-8 path");
    let common = ["--plugin", path, "--timeout", "3"];
    let listen = spawn(&[&common[..], &["--listen", "127.0.0.1:0"]].concat());
    let port = port_of(&listen.line_with("listening on", LIMIT));
    let address = format!("127.0.0.1:{port}");
    let sender = spawn(&[&common[..], &["--peer", &address, "--max-size", "64K"]].concat());
    let sent = sender.finish(LIMIT);
    let received = listen.finish(LIMIT);
    assert!(
        received.stdout.contains("# peer connected from 127.0.0.1:")
            && received.stdout.contains("# receiver: "),
        "{}",
        received.describe()
    );
    assert!(sent.stdout.contains("two processes"), "{}", sent.describe());
    assert!(
        sent.elapsed < Duration::from_secs(15),
        "{}",
        sent.describe()
    );
}
