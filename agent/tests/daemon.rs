//! `mpib-agent` as a process, through what a plugin and an operator touch: the registration
//! socket (the reference wire), the hint file, `status`, `set`, SIGHUP, SIGTERM, SIGKILL and a
//! restart.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
use std::net::Ipv4Addr;
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{eventually, register, request, temp_dir, Agent};
use mpib_proto::agent_wire::{AgentRequest, AgentResponse, AgentStatus};

/// Flags that let one process take every slot, for the tests that fill the table.
const NO_FLOW_LIMITS: [&str; 4] = [
    "--max-flows-per-process",
    "256",
    "--max-flows-per-user",
    "256",
];

fn slot_of(response: AgentResponse) -> u32 {
    match response {
        AgentResponse::Register {
            status: AgentStatus::Success,
            hint_slot,
        } => hint_slot,
        other => panic!("registration refused: {other:?}"),
    }
}

#[test]
fn one_slot_per_sout_pair_written_to_the_hint_file_and_freed_with_the_last_connection() {
    let dir = temp_dir("slots");
    let agent = Agent::start(&dir, &["--policy", "static"]);
    let a = slot_of(request(&agent.socket(), register(1, 2)));
    let b = slot_of(request(&agent.socket(), register(2, 2)));
    let c = slot_of(request(&agent.socket(), register(3, 3)));
    assert_eq!((a, b), (0, 0), "one SOUT pair, one slot");
    assert_eq!(c, 1);
    let (sup_bw, seq, src, dst) = agent.entry(1);
    assert_eq!((sup_bw, seq % 2), (0, 0));
    assert_eq!(
        (src, dst),
        (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 3))
    );
    let status = agent.status();
    assert!(
        status.contains("slots 2/256 used, 3 connections"),
        "{status}"
    );
    assert!(status.contains("10.0.0.1->10.0.0.2"), "{status}");
    let deregister = |conn_id| request(&agent.socket(), AgentRequest::Deregister { conn_id });
    let ok = AgentResponse::Deregister {
        status: AgentStatus::Success,
    };
    assert_eq!(deregister(1), ok);
    assert_eq!(
        agent.entry(0).2,
        Ipv4Addr::new(10, 0, 0, 1),
        "slot 0 still has conn 2"
    );
    assert_eq!(deregister(2), ok);
    assert_eq!(
        agent.entry(0).2,
        Ipv4Addr::UNSPECIFIED,
        "freed with its last connection"
    );
    assert_eq!(
        deregister(2),
        AgentResponse::Deregister {
            status: AgentStatus::InvalidRequest
        },
        "an unknown connection"
    );
    assert_eq!(agent.stop(), 0, "SIGTERM stops it cleanly");
    assert!(!dir.join("agent.sock").exists(), "sockets removed on stop");
    assert!(
        dir.join("hints").exists(),
        "the hint file stays for running jobs"
    );
}

#[test]
fn a_full_table_answers_no_free_slots() {
    let dir = temp_dir("full");
    // One process fills the table: no flow limit (bounds.rs tests the limits).
    let agent = Agent::start(&dir, &NO_FLOW_LIMITS);
    let socket = agent.socket();
    let mut stream = UnixStream::connect(&socket).unwrap();
    // 256 pairs on one connection (the reference allows several messages per connection).
    for i in 0..256u32 {
        let request = AgentRequest::Register {
            conn_id: i,
            sout_src: [10, 2, (i >> 8) as u8, i as u8],
            sout_dst: [10, 3, 0, 1],
            sup_src: [0; 4],
            sup_dst: [0; 4],
        };
        stream.write_all(request.encode().as_bytes()).unwrap();
        let mut response = [0u8; 16];
        stream.read_exact(&mut response).unwrap();
        assert_eq!(slot_of(AgentResponse::decode(&response).unwrap()), i);
    }
    assert_eq!(
        request(&socket, register(999, 9)),
        AgentResponse::Register {
            status: AgentStatus::NoFreeSlots,
            hint_slot: 0
        }
    );
    assert_eq!(
        slot_of(request(
            &socket,
            register(1000, 1).clone_with_src([10, 2, 0, 7])
        )),
        7,
        "a known pair still joins its slot"
    );
}

trait WithSrc {
    fn clone_with_src(&self, src: [u8; 4]) -> AgentRequest;
}

impl WithSrc for AgentRequest {
    fn clone_with_src(&self, src: [u8; 4]) -> AgentRequest {
        match *self {
            AgentRequest::Register {
                conn_id,
                sup_src,
                sup_dst,
                ..
            } => AgentRequest::Register {
                conn_id,
                sout_src: src,
                sout_dst: [10, 3, 0, 1],
                sup_src,
                sup_dst,
            },
            other => other,
        }
    }
}

/// Sends `bytes`, then reads what comes back until the agent closes (or 3 s).
fn exchange_raw(socket: &std::path::Path, bytes: &[u8]) -> (Vec<u8>, Duration) {
    let started = Instant::now();
    let mut stream = UnixStream::connect(socket).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    let _ = stream.write_all(bytes);
    let mut reply = Vec::new();
    let _ = stream.read_to_end(&mut reply);
    (reply, started.elapsed())
}

#[test]
fn bad_input_gets_status_2_or_a_close_and_never_stalls_other_clients() {
    let dir = temp_dir("bad");
    let agent = Agent::start(&dir, &[]);
    let socket = agent.socket();
    // Silent clients hold connections open for the whole test.
    let silent: Vec<UnixStream> = (0..8)
        .map(|_| UnixStream::connect(&socket).unwrap())
        .collect();
    let good = register(1, 2).encode();
    let good = good.as_bytes();
    let mut wrong_magic = good.to_vec();
    wrong_magic[0] ^= 0xFF;
    let mut wrong_type = good.to_vec();
    wrong_type[6] = 9;
    let mut wrong_length = good.to_vec();
    wrong_length[4] = 200;
    let mut oversized = good.to_vec();
    oversized.extend_from_slice(&[0xAB; 4000]);
    oversized[4] = (oversized.len() & 0xFF) as u8;
    oversized[5] = (oversized.len() >> 8) as u8;
    let cases: [(&str, &[u8], bool); 6] = [
        ("short", &good[..5], false),
        ("wrong magic", &wrong_magic, true),
        ("wrong type", &wrong_type, true),
        ("wrong length", &wrong_length, true),
        ("oversized", &oversized, true),
        ("garbage", &[0x42; 64], true),
    ];
    for (name, bytes, answered) in cases {
        let (reply, _) = exchange_raw(&socket, bytes);
        if answered {
            assert!(reply.len() == 16 || reply.len() == 12, "{name}: {reply:?}");
            let decoded = AgentResponse::decode(&reply).unwrap();
            let status = match decoded {
                AgentResponse::Register { status, .. } | AgentResponse::Deregister { status } => {
                    status
                }
            };
            assert_eq!(status, AgentStatus::InvalidRequest, "{name}");
        } else {
            assert!(reply.is_empty(), "{name}: closed without an answer");
        }
        // Another client is served at once despite the silent ones.
        let started = Instant::now();
        slot_of(request(&socket, register(7, 2)));
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "{name}: stalled"
        );
    }
    drop(silent);
    let status = agent.status();
    assert!(status.contains("slots 1/256"), "{status}");
    assert!(agent.child.id() > 0);
}

/// Child side of `a_process_that_exits_without_deregistering_loses_its_connections`.
#[test]
fn child_registers_and_exits() {
    let Ok(socket) = std::env::var("MPIB_AGENT_TEST_CHILD_SOCKET") else {
        return;
    };
    slot_of(request(std::path::Path::new(&socket), register(77, 5)));
    std::process::exit(0);
}

#[test]
fn a_process_that_exits_without_deregistering_loses_its_connections() {
    let dir = temp_dir("reclaim");
    let agent = Agent::start(&dir, &["--interval-ms", "50"]);
    let status = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_registers_and_exits", "--nocapture"])
        .env("MPIB_AGENT_TEST_CHILD_SOCKET", agent.socket())
        .status()
        .unwrap();
    assert!(status.success());
    // The child is gone: within a few intervals its connection and slot are reclaimed.
    assert!(
        eventually(Duration::from_secs(5), || agent.entry(0).2.is_unspecified()),
        "slot not reclaimed: {}",
        agent.status()
    );
    assert!(agent.status().contains("slots 0/256"));
}

#[test]
fn a_restart_keeps_the_hint_file_and_its_flows() {
    let dir = temp_dir("restart");
    let agent = Agent::start(&dir, &["--policy", "static"]);
    assert_eq!(slot_of(request(&agent.socket(), register(1, 2))), 0);
    assert_eq!(slot_of(request(&agent.socket(), register(2, 3))), 1);
    let (code, out, _) = agent.command(&["set", "1", "300"]);
    assert_eq!((code, out.trim()), (0, "ok: 1 flow(s) set to sup_bw 300"));
    assert_eq!(agent.entry(1).0, 300);
    agent.kill();
    // A plugin still reading the file sees the same entries while no agent runs.
    let again = Agent::start(&dir, &["--policy", "static"]);
    assert!(again.log_text().contains("reused"), "{}", again.log_text());
    assert_eq!(again.entry(1).0, 300, "entries survive the restart");
    let status = again.status();
    assert!(status.contains("(from before a restart)"), "{status}");
    assert_eq!(
        slot_of(request(&again.socket(), register(9, 3))),
        1,
        "same pair, same slot"
    );
    assert_eq!(
        slot_of(request(&again.socket(), register(10, 4))),
        2,
        "a new pair"
    );
}

#[test]
fn operators_set_and_release_flows_and_bad_commands_say_why() {
    let dir = temp_dir("set");
    let agent = Agent::start(&dir, &["--policy", "static"]);
    slot_of(request(&agent.socket(), register(1, 2)));
    slot_of(request(&agent.socket(), register(2, 3)));
    let (code, out, _) = agent.command(&["set", "--all", "512"]);
    assert_eq!((code, out.trim()), (0, "ok: 2 flow(s) set to sup_bw 512"));
    assert_eq!((agent.entry(0).0, agent.entry(1).0), (512, 512));
    assert!(agent.status().contains("pinned"));
    let (code, _, _) = agent.command(&["set", "0", "auto"]);
    assert_eq!(code, 0);
    assert!(
        eventually(Duration::from_secs(3), || agent.entry(0).0 == 0),
        "back to its static policy (0)"
    );
    let (code, _, err) = agent.command(&["set", "9", "100"]);
    assert_eq!(code, 1);
    assert!(err.contains("no flow in slot 9"), "{err}");
    let (code, _, err) = agent.command(&["set", "0", "2000"]);
    assert_eq!(code, 2);
    assert!(err.contains("0..1024"), "{err}");
    let control_mode = std::fs::metadata(agent.control()).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(control_mode.permissions().mode() & 0o777, 0o600);
}

#[test]
fn sighup_reloads_the_rules_and_keeps_the_old_ones_on_a_bad_file() {
    let dir = temp_dir("reload");
    let config = dir.join("agent.toml");
    std::fs::write(&config, "default = \"static\"\n").unwrap();
    let agent = Agent::start(
        &dir,
        &["--config", config.to_str().unwrap(), "--interval-ms", "50"],
    );
    slot_of(request(&agent.socket(), register(1, 2)));
    std::fs::write(
        &config,
        "default = \"static\"\n[[rule]]\ndst = \"10.0.0.0/24\"\npolicy = \"static\"\nsup_bw = 300\n",
    )
    .unwrap();
    agent.signal(libc::SIGHUP);
    assert!(
        eventually(Duration::from_secs(3), || agent.entry(0).0 == 300),
        "the new rule applies: {}",
        agent.log_text()
    );
    std::fs::write(&config, "default = \"fastest\"\n").unwrap();
    agent.signal(libc::SIGHUP);
    assert!(eventually(Duration::from_secs(3), || agent
        .log_text()
        .contains("reload refused")));
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(agent.entry(0).0, 300, "the old configuration stays");
    assert!(
        agent.log_text().contains("fastest"),
        "the error names the value"
    );
}

#[test]
fn bad_flags_and_a_bad_config_exit_2_naming_them() {
    let dir = temp_dir("flags");
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_mpib-agent"))
            .args(args)
            .env_remove("MPIB_AGENT_CONFIG")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = run(&["--policy", "fastest"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("--policy \"fastest\""), "{err}");
    let (code, err) = run(&["--frobnicate"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("--frobnicate"), "{err}");
    let config = dir.join("bad.toml");
    std::fs::write(&config, "interval_ms = 1\n").unwrap();
    let hints = dir.join("hints");
    let (code, err) = run(&[
        "--config",
        config.to_str().unwrap(),
        "--hint-path",
        hints.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(2));
    assert!(err.contains("interval_ms"), "{err}");
    let (code, err) = run(&["status", "--control", dir.join("nothing").to_str().unwrap()]);
    assert_eq!(code, Some(1));
    assert!(err.contains("is mpib-agent running?"), "{err}");
}

#[test]
fn a_second_agent_on_the_same_socket_is_refused() {
    let dir = temp_dir("twice");
    let _first = Agent::start(&dir, &[]);
    let out = Command::new(env!("CARGO_BIN_EXE_mpib-agent"))
        .args(["--socket", dir.join("agent.sock").to_str().unwrap()])
        .args(["--hint-path", dir.join("hints").to_str().unwrap()])
        .args(["--metrics-listen", "off"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("another mpib-agent holds it"), "{err}");
    // Another hint file but the same socket: refused at the socket.
    let out = Command::new(env!("CARGO_BIN_EXE_mpib-agent"))
        .args(["--socket", dir.join("agent.sock").to_str().unwrap()])
        .args(["--hint-path", dir.join("hints2").to_str().unwrap()])
        .args(["--metrics-listen", "off"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("another agent is serving there"), "{err}");
}

#[test]
fn flows_taken_back_after_a_restart_are_given_up_only_when_the_table_is_full() {
    let dir = temp_dir("orphan");
    let agent = Agent::start(&dir, &["--policy", "static"]);
    assert_eq!(slot_of(request(&agent.socket(), register(1, 2))), 0);
    agent.kill();
    let again = Agent::start(
        &dir,
        &[
            &["--policy", "static", "--interval-ms", "20"],
            &NO_FLOW_LIMITS[..],
        ]
        .concat(),
    );
    std::thread::sleep(Duration::from_millis(100));
    let socket = again.socket();
    for i in 1..256u32 {
        let request_i = register(i, 2).clone_with_src([10, 9, (i >> 8) as u8, i as u8]);
        assert_eq!(
            slot_of(request(&socket, request_i)),
            i,
            "slot 0 is kept while others are free"
        );
    }
    assert_eq!(again.entry(0).3, Ipv4Addr::new(10, 0, 0, 2));
    // Full: the recovered flow, which no live connection reads (no probes file names it), goes.
    assert_eq!(slot_of(request(&socket, register(999, 99))), 0);
    assert_eq!(again.entry(0).3, Ipv4Addr::new(10, 0, 0, 99));
}

#[test]
fn a_hint_file_shrunk_under_the_agent_is_repaired_not_fatal() {
    let dir = temp_dir("shrunk");
    let agent = Agent::start(&dir, &["--policy", "static", "--interval-ms", "50"]);
    assert_eq!(slot_of(request(&agent.socket(), register(1, 2))), 0);
    assert_eq!(slot_of(request(&agent.socket(), register(2, 3))), 1);
    let (code, _, _) = agent.command(&["set", "1", "300"]);
    assert_eq!(code, 0);
    // Another process shrinks the file; the agent's next write faults (or its next interval
    // sees the size).
    std::fs::OpenOptions::new()
        .write(true)
        .open(agent.hints())
        .expect("open the hint file")
        .set_len(0)
        .expect("truncate it");
    let (code, out, err) = agent.command(&["set", "1", "400"]);
    assert_eq!(code, 0, "{out}{err}");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !agent
        .log_text()
        .contains("another process shrank, removed or replaced it")
    {
        assert!(std::time::Instant::now() < deadline, "{}", agent.log_text());
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = agent.log_text();
    assert!(log.contains("Repaired and its flows written back"), "{log}");
    let (share, seq, src, dst) = agent.entry(1);
    assert_eq!(share, 400, "the last share written back");
    assert_eq!(seq % 2, 0);
    assert!(
        !src.is_unspecified() && !dst.is_unspecified(),
        "the flow's pair written back"
    );
    assert_eq!(agent.stop(), 0, "still running, stops cleanly");
}
