//! A made-up job for measuring the agent busy (docs/AGENT.md, "Resting when idle"): registers
//! `--flows` SOUT pairs with the agent, then holds a probes file of `--connections` advanced
//! send connections spread over their slots, its heartbeat fresh, for `--seconds`.
//!
//! ```text
//! cargo run --release -p mpib-agent --example probes_load -- \
//!     --socket DIR/agent.sock --probes-dir DIR/probes --connections 4096 --flows 64 --seconds 12
//! ```
#![allow(clippy::expect_used, clippy::unwrap_used, missing_docs)]

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use mpib_probes::{ConnectionInfo, Direction, Mode, PathClass, ProbesFile, RailInfo, WriterInfo};
use mpib_proto::agent_wire::{AgentRequest, AgentResponse, AgentStatus};

fn argument(name: &str, default: &str) -> String {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|at| args.get(at + 1).cloned())
        .unwrap_or_else(|| default.to_string())
}

/// Registers flow `n` (SOUT 10.20.0.1 -> 10.21.X.Y) and returns its slot.
fn register(socket: &PathBuf, n: u32) -> u32 {
    let [_, _, x, y] = n.to_be_bytes();
    let request = AgentRequest::Register {
        conn_id: n,
        sout_src: [10, 20, 0, 1],
        sout_dst: [10, 21, x, y],
        sup_src: [10, 22, 0, 1],
        sup_dst: [10, 23, x, y],
    };
    let mut stream = UnixStream::connect(socket).expect("connect to the agent");
    stream.write_all(request.encode().as_bytes()).unwrap();
    let mut response = vec![0u8; request.response_len()];
    stream.read_exact(&mut response).unwrap();
    match AgentResponse::decode(&response).unwrap() {
        AgentResponse::Register {
            status: AgentStatus::Success,
            hint_slot,
        } => hint_slot,
        other => panic!("flow {n} refused: {other:?}"),
    }
}

fn main() {
    let socket = PathBuf::from(argument("--socket", "/tmp/mpib/agent.sock"));
    let dir = PathBuf::from(argument("--probes-dir", "/dev/shm/mpib"));
    let connections: usize = argument("--connections", "4096").parse().unwrap();
    let flows: u32 = argument("--flows", "64").parse().unwrap();
    let seconds: u64 = argument("--seconds", "12").parse().unwrap();
    let slots: Vec<u32> = (0..flows).map(|n| register(&socket, n)).collect();
    let rail = |device: &str| RailInfo {
        device: device.into(),
        port: 1,
        speed_mbps: 400_000,
    };
    let info = WriterInfo::for_this_process(vec![rail("mlx5_0"), rail("mlx5_1")]);
    std::fs::create_dir_all(&dir).unwrap();
    let probes = ProbesFile::create(&dir, &info).unwrap();
    let held: Vec<_> = (0..connections)
        .map(|i| {
            let info = ConnectionInfo {
                peer: SocketAddrV4::new(Ipv4Addr::new(10, 21, 0, (i % 250) as u8), 40_000),
                direction: Direction::Send,
                path_class: PathClass::InterIsland,
                mode: Mode::Advanced,
                hint_slot: slots[i % slots.len()],
                device: 0,
            };
            probes
                .claim_connection(&info)
                .expect("a free connection slot")
        })
        .collect();
    println!("{} connections over {} flows", held.len(), slots.len());
    let end = Instant::now() + Duration::from_secs(seconds);
    while Instant::now() < end {
        probes.heartbeat(mpib_probes::now_ns());
        std::thread::sleep(Duration::from_millis(500));
    }
    drop(held);
    let _ = probes.remove();
}
