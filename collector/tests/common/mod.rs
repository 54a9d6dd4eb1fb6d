//! Helpers shared by the integration tests: temp dirs, probes fixtures, running the binary
//! (bounded in time), scraping and parsing the Prometheus text.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod otlp_receiver;

use mpib_probes::declared::{
    CTS_POSTED, CTS_SIGNALED, MASK_MISMATCHES, PROTOCOL_ERRORS, RAIL_ERROR_COMPLETIONS,
    RAIL_FAILOVERS, RAIL_RECV_COMPLETIONS, RAIL_REPLAYED_BYTES, RAIL_RX_BYTES,
    RAIL_SEND_COMPLETIONS, RAIL_TX_BYTES, RAIL_WORK_REQUESTS, SRQ_DEPTH, SRQ_HIGH_WATER,
    SRQ_LOW_WATER, SRQ_LOW_WATER_HITS, SRQ_REFILLS,
};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mpib_probes::{
    now_ns, ConnectionInfo, Declaration, Direction, EventKind, Merge, Mode, PathClass, ProbesFile,
    ProcessCounter, RailCounter, RailInfo, SlowTransfer, ValueUnit, WriterInfo, DECLARATIONS,
};

pub const HOST: &str = "testhost";
/// A pid no process has (above the kernel's largest pid_max, 2^22).
pub const DEAD_PID: u32 = 999_999_999;

/// A directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!(
            "mpib-collector-test-{tag}-{}-{n}-{}",
            std::process::id(),
            now_ns()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn rails() -> Vec<RailInfo> {
    vec![
        RailInfo {
            device: "mlx5_0".into(),
            port: 1,
            speed_mbps: 200_000,
        },
        RailInfo {
            device: "mlx5_1".into(),
            port: 2,
            speed_mbps: 400_000,
        },
    ]
}

pub fn writer(pid: u32, start_ns: u64) -> WriterInfo {
    WriterInfo {
        pid,
        start_ns,
        host: HOST.into(),
        devices: vec![mpib_probes::DeviceEntry::of_rails(&rails())],
        rails: rails(),
        slow_threshold_ns: 1_000_000,
        sample_one_in: 0,
    }
}

/// A live writer (this test process's pid, started now).
pub fn live_writer() -> WriterInfo {
    writer(std::process::id(), now_ns())
}

pub fn conn_info(
    peer: [u8; 4],
    port: u16,
    dir: Direction,
    path: PathClass,
    mode: Mode,
    slot: u32,
) -> ConnectionInfo {
    ConnectionInfo {
        peer: SocketAddrV4::new(Ipv4Addr::from(peer), port),
        direction: dir,
        path_class: path,
        mode,
        hint_slot: slot,
        device: 0,
    }
}

/// A slow transfer on both rails: sout 1000..5000 ns after `base`, sup 1500..9000 ns.
pub fn both_rails_transfer(base: u64, conn_index: u32) -> SlowTransfer {
    SlowTransfer {
        kind: EventKind::SLOW,
        direction: Direction::Send,
        rail_mask: 3,
        conn_index,
        size: 1 << 20,
        post_ns: [base + 1000, base + 1500],
        done_ns: [base + 5000, base + 9000],
        rail_bytes: [700 << 10, 324 << 10],
        sup_bw: 324,
        slot: 7,
        qp_num: [0x1234, 0x5678],
        peer: SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), 5000),
        device: 0,
        operation: all_reduce(),
    }
}

/// What NCCL says of a ring all-reduce with the simple protocol, 2 peers and 4 flows each.
pub fn all_reduce() -> mpib_probes::Operation {
    mpib_probes::Operation {
        functions: 1 << 4,
        algorithms: 1 << 1,
        protocols: 1 << 2,
        peers: 2,
        flows_per_peer: 4,
    }
}

/// A rail counter this version of the plugin does not declare: the test suite's own, as a
/// newer plugin would add one. The collector must export it with no change.
pub const WIDGETS: RailCounter = RailCounter::at(22);
/// Its declaration, with the name the scrape must show.
pub const WIDGETS_DECLARATION: Declaration = WIDGETS.declare(
    ValueUnit::Count,
    Merge::Sum,
    "mpib_fixture_widgets_total",
    "Widgets made by the test fixture (a value the collector was not built with).",
);
/// A process gauge-like counter of the fixture, in the process block.
pub const FIXTURE_PROCESS: ProcessCounter = ProcessCounter::at(10);
/// Its declaration.
pub const FIXTURE_PROCESS_DECLARATION: Declaration = FIXTURE_PROCESS.declare(
    ValueUnit::Bytes,
    Merge::Sum,
    "mpib_fixture_process_bytes_total",
    "Bytes the test fixture counted for the whole process.",
);

/// The family named `name`: one of this version's, or one the fixture file declares.
pub fn known_family(name: &str) -> Option<mpib_collector::catalog::Family> {
    let fixture = [WIDGETS_DECLARATION, FIXTURE_PROCESS_DECLARATION];
    let declared = fixture.iter().find(|d| d.name == name).map(|d| {
        mpib_collector::catalog::declared_family(&mpib_probes::Declared::from(d)).unwrap()
    });
    declared.or_else(|| mpib_collector::catalog::find(name))
}

/// A probes file declaring this version's values plus the fixture's two.
pub fn fixture_file(dir: &Path, info: &WriterInfo) -> ProbesFile {
    let mut declarations = DECLARATIONS.to_vec();
    declarations.extend([WIDGETS_DECLARATION, FIXTURE_PROCESS_DECLARATION]);
    ProbesFile::create_declaring(dir, info, &declarations).unwrap()
}

/// The known fixture: counters on both rails, transfers, two connections, a histogram and one
/// slow transfer.
pub fn fill_fixture(p: &ProbesFile) {
    let (sout, sup) = (p.rail(0), p.rail(1));
    sout.add(RAIL_TX_BYTES, 1_000_000);
    sout.add(RAIL_RX_BYTES, 500_000);
    sout.add(RAIL_WORK_REQUESTS, 40);
    for _ in 0..3 {
        sout.inc(RAIL_SEND_COMPLETIONS);
    }
    for _ in 0..2 {
        sout.inc(RAIL_RECV_COMPLETIONS);
    }
    sout.set(SRQ_DEPTH, 100);
    sout.set(SRQ_LOW_WATER, 32);
    sout.set(SRQ_HIGH_WATER, 256);
    sout.inc(SRQ_REFILLS);
    sout.inc(SRQ_LOW_WATER_HITS);
    sout.inc(MASK_MISMATCHES);
    sout.inc(PROTOCOL_ERRORS);
    for _ in 0..5 {
        sout.inc(CTS_POSTED);
    }
    sout.inc(CTS_SIGNALED);
    sout.inc(RAIL_ERROR_COMPLETIONS);
    sout.record_latency_ns(1500);
    sout.record_latency_ns(1500);
    sout.record_latency_ns(3_000_000);
    sup.add(RAIL_TX_BYTES, 250_000);
    sup.add(WIDGETS, 7);
    p.add(FIXTURE_PROCESS, 4096);
    sup.set(SRQ_DEPTH, 7);
    sup.record_latency_ns(100);
    for mask in [1, 1, 1, 2, 3, 3] {
        p.transfers().record(mask);
    }
    let a = p
        .claim_connection(&conn_info(
            [10, 0, 0, 2],
            5000,
            Direction::Send,
            PathClass::InterIsland,
            Mode::Vanilla,
            0,
        ))
        .unwrap();
    a.add_split([700, 300]);
    a.set_operation(all_reduce().encode().0);
    let b = p
        .claim_connection(&conn_info(
            [10, 0, 0, 3],
            6000,
            Direction::Recv,
            PathClass::IntraIsland,
            Mode::Advanced,
            5,
        ))
        .unwrap();
    b.add_split([100, 900]);
    // The receive connection failed its SUP rail over (docs/PROTOCOL.md section 10).
    b.rail_failed(1);
    sup.inc(RAIL_FAILOVERS);
    sout.add(RAIL_REPLAYED_BYTES, 4096);
    let index = a.index();
    std::mem::forget(a); // keep both connections open
    std::mem::forget(b);
    p.record_slow_transfer(&both_rails_transfer(now_ns(), index));
    p.heartbeat(now_ns());
}

fn base_command(dir: &Path, extra: &[&str]) -> Command {
    let exe = env!("CARGO_BIN_EXE_mpib-collector");
    let mut cmd = Command::new(exe);
    cmd.arg("--probes-dir").arg(dir);
    cmd.args(extra);
    for var in [
        "MPIB_PROBES_DIR",
        "MPIB_COLLECTOR_INTERVAL_MS",
        "MPIB_COLLECTOR_STALE_AFTER",
        "MPIB_COLLECTOR_LISTEN",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "MPIB_COLLECTOR_OTLP_SIGNALS",
        "OTEL_METRIC_EXPORT_INTERVAL",
        "MPIB_HINT_PATH",
        "MPIB_SYSFS",
        "MPIB_COLLECTOR_ALLOWED_UIDS",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("RUST_LOG", "info");
    cmd
}

/// The default extra arguments: no real hint file, no real sysfs.
pub fn isolated(dir: &TempDir) -> Vec<String> {
    vec![
        "--hint-path".into(),
        dir.join("no-hints").display().to_string(),
        "--sysfs".into(),
        dir.join("no-sysfs").display().to_string(),
    ]
}

/// `--once` over `dir` with the [`isolated`] paths and `extra` flags: the scrape and the
/// collector's stderr; fails unless it exited 0.
pub fn scrape_isolated(dir: &TempDir, extra: &[&str]) -> (Scrape, String) {
    let mut args = isolated(dir);
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run_once(dir.path(), &args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    (
        Scrape::parse(&String::from_utf8(out.stdout).unwrap()),
        stderr,
    )
}

/// Run the collector with `--once` (60 s at most); returns its output.
pub fn run_once(dir: &Path, extra: &[&str]) -> Output {
    let mut cmd = base_command(dir, extra);
    cmd.arg("--once");
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = cmd.spawn().unwrap();
    wait_bounded(child, Duration::from_secs(60))
}

/// Wait for `child` at most `limit`, killing it past that (and failing). Its output is read
/// while it runs: a child that writes more than a pipe holds (64 KiB, a scrape of thousands of
/// series) would otherwise wait on the pipe for ever.
pub fn wait_bounded(mut child: Child, limit: Duration) -> Output {
    fn drain(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    }
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let deadline = Instant::now() + limit;
    let (status, late) = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break (status, false);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            break (child.wait().unwrap(), true);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    };
    assert!(
        !late,
        "collector ran past {limit:?}; stderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A collector serving on an ephemeral port; killed on drop.
pub struct Running {
    pub child: Option<Child>,
    pub url: String,
    pub log: Arc<Mutex<Vec<String>>>,
}

impl Running {
    pub fn start(dir: &Path, extra: &[&str]) -> Running {
        let mut cmd = base_command(dir, extra);
        cmd.args(["--listen", "127.0.0.1:0"]);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().unwrap();
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut first = String::new();
            let mut reader = BufReader::new(stdout);
            let _ = reader.read_line(&mut first);
            let _ = tx.send(first);
            let _ = std::io::copy(&mut reader, &mut std::io::sink());
        });
        let first = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("collector printed no URL");
        let url = first
            .trim()
            .strip_prefix("mpib-collector: serving ")
            .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
            .to_owned();
        Running {
            child: Some(child),
            url,
            log,
        }
    }

    pub fn scrape(&self) -> String {
        http_get(&self.url)
    }

    /// Scrape until `check` accepts the parsed samples, for at most `limit`.
    pub fn scrape_until(&self, limit: Duration, check: impl Fn(&Scrape) -> bool) -> Scrape {
        let deadline = Instant::now() + limit;
        loop {
            let scrape = Scrape::parse(&self.scrape());
            if check(&scrape) {
                return scrape;
            }
            if Instant::now() > deadline {
                panic!(
                    "condition not met within {limit:?}; last scrape:\n{}",
                    scrape.text
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log_lines(&self, needle: &str) -> usize {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    }

    /// Send SIGTERM (via `kill`) and wait for a clean exit.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        let child = self.child.take().unwrap();
        let status = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status()
            .unwrap();
        assert!(status.success());
        wait_bounded(child, Duration::from_secs(30)).status
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// GET `url` (http://host:port/path) with a raw HTTP/1.1 request; the body, after checking 200.
pub fn http_get(url: &str) -> String {
    let rest = url.strip_prefix("http://").unwrap();
    let (addr, path) = rest
        .split_once('/')
        .map_or((rest, "/".to_owned()), |(a, p)| (a, format!("/{p}")));
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    body.to_owned()
}

/// One sample line.
#[derive(Clone, Debug)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A parsed exposition.
pub struct Scrape {
    pub text: String,
    pub samples: Vec<Sample>,
    /// `# TYPE` lines: family -> type.
    pub types: BTreeMap<String, String>,
}

impl Scrape {
    pub fn parse(text: &str) -> Scrape {
        let mut samples = Vec::new();
        let mut types = BTreeMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                assert!(
                    types.insert(name.to_owned(), kind.to_owned()).is_none(),
                    "duplicate TYPE {name}"
                );
                continue;
            }
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            samples.push(parse_sample(line));
        }
        Scrape {
            text: text.to_owned(),
            samples,
            types,
        }
    }

    /// The value of `name` whose labels include all of `labels`; fails if several match.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let found: Vec<&Sample> = self.matching(name, labels);
        assert!(found.len() <= 1, "{name} {labels:?} matches {found:?}");
        found.first().map(|s| s.value)
    }

    pub fn matching(&self, name: &str, labels: &[(&str, &str)]) -> Vec<&Sample> {
        self.samples
            .iter()
            .filter(|s| {
                s.name == name
                    && labels
                        .iter()
                        .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .collect()
    }

    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels)
            .unwrap_or_else(|| panic!("no {name} {labels:?} in\n{}", self.text))
    }

    pub fn has_family(&self, name: &str) -> bool {
        self.samples
            .iter()
            .any(|s| mpib_collector::catalog::family_of(&s.name).is_some_and(|f| f.name == name))
    }
}

fn parse_sample(line: &str) -> Sample {
    let (series, value) = line.rsplit_once(' ').unwrap();
    let value = match value {
        "+Inf" => f64::INFINITY,
        v => v.parse().unwrap_or_else(|_| panic!("bad value in {line}")),
    };
    let (name, labels) = match series.split_once('{') {
        Some((name, rest)) => (name, parse_labels(rest.strip_suffix('}').unwrap())),
        None => (series, BTreeMap::new()),
    };
    Sample {
        name: name.to_owned(),
        labels,
        value,
    }
}

fn parse_labels(mut s: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    while !s.is_empty() {
        let (key, rest) = s.split_once("=\"").unwrap();
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let mut end = rest.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next().map(|(_, c)| c) {
                    Some('n') => value.push('\n'),
                    Some(other) => value.push(other),
                    None => {}
                },
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        out.insert(key.trim_start_matches(',').to_owned(), value);
        s = rest[end..].trim_start_matches(',');
    }
    out
}
