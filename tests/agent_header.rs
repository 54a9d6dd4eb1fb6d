//! `include/mpib_agent.h` is the interface the plugin speaks: a C program built from the header
//! (tests/c/agent_golden.c) encodes each message through the header's structs, and the plugin's
//! encoder must produce the same bytes while its decoder reads the C program's bytes back. The
//! header's `_Static_assert`s check the sizes at compile time, and the program prints the offsets
//! a reader in another language relies on.
#![allow(clippy::unwrap_used, clippy::expect_used)] // A failed unwrap fails the test, with its message.

use std::path::Path;
use std::process::Command;

use nccl_net_mpib::proto::agent_wire::{AgentRequest, AgentResponse, AgentStatus};

/// Compiles and runs the golden program; its output lines.
fn golden_lines() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = std::env::temp_dir().join(format!("mpib-agent-golden-{}", std::process::id()));
    let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let built = Command::new(&compiler)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(root.join("include"))
        .arg(root.join("tests/c/agent_golden.c"))
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler `{compiler}`: {e}"));
    assert!(
        built.status.success(),
        "{compiler} failed on include/mpib_agent.h:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let run = Command::new(&out).output().expect("run the golden program");
    let _ = std::fs::remove_file(&out);
    assert!(run.status.success(), "the golden program failed");
    String::from_utf8(run.stdout)
        .expect("ASCII output")
        .lines()
        .map(str::to_string)
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
        .collect()
}

#[test]
fn the_c_header_and_the_plugin_agree_byte_for_byte() {
    let lines = golden_lines();
    assert_eq!(lines.len(), 5, "{lines:?}");
    let register = AgentRequest::Register {
        conn_id: 0x1234_0005,
        sout_src: [10, 0, 0, 1],
        sout_dst: [10, 0, 0, 2],
        sup_src: [192, 168, 0, 1],
        sup_dst: [192, 168, 0, 2],
    };
    let response = AgentResponse::Register {
        status: AgentStatus::Success,
        hint_slot: 7,
    };
    let deregister = AgentRequest::Deregister {
        conn_id: 0x1234_0005,
    };
    let deregistered = AgentResponse::Deregister {
        status: AgentStatus::NoFreeSlots,
    };
    // C -> plugin.
    assert_eq!(AgentRequest::decode(&unhex(&lines[0])), Ok(register));
    assert_eq!(AgentResponse::decode(&unhex(&lines[1])), Ok(response));
    assert_eq!(AgentRequest::decode(&unhex(&lines[2])), Ok(deregister));
    assert_eq!(AgentResponse::decode(&unhex(&lines[3])), Ok(deregistered));
    // Plugin -> C.
    assert_eq!(hex(register.encode().as_bytes()), lines[0]);
    assert_eq!(hex(response.encode().as_bytes()), lines[1]);
    assert_eq!(hex(deregister.encode().as_bytes()), lines[2]);
    assert_eq!(hex(deregistered.encode().as_bytes()), lines[3]);
    // conn_id at 8, sup_dst_ip at 24, hint_slot at 12, the hint entries at 16.
    assert_eq!(lines[4], "8 24 12 16");
}
