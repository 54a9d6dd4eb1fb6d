//! Who may register (docs/SECURITY.md, "The agent"): with `--allowed-uids` / `--allowed-gids`,
//! a registration from another local user (this test executable re-run as that user through
//! `setpriv`) is answered status 2, counted `not_allowed` and logged once per uid; listed by uid
//! or by gid, the same client is served.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{free_port, metrics, register, request, temp_dir, Agent};
use mpib_driver::other_user::{other_user_or_skip, OtherUser};
use mpib_proto::agent_wire::{AgentResponse, AgentStatus};

const CHILD_SOCKET: &str = "MPIB_AGENT_TEST_FOREIGN_SOCKET";

/// Child side: registers on the socket named by the variable and prints the status.
#[test]
fn foreign_client_registers() {
    let Ok(socket) = std::env::var(CHILD_SOCKET) else {
        return;
    };
    let AgentResponse::Register { status, .. } = request(Path::new(&socket), register(88, 9))
    else {
        panic!("not a registration response")
    };
    println!("foreign-status={status:?}");
    std::process::exit(0);
}

/// A copy of this test executable the other user may run (the build directory may be private).
fn client_copy(dir: &Path) -> PathBuf {
    let copy = dir.join("foreign-client");
    std::fs::copy(std::env::current_exe().unwrap(), &copy).unwrap();
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
    copy
}

/// Registers as `user` through `client`; the status the agent answered.
fn register_as(user: &OtherUser, client: &Path, agent: &Agent) -> String {
    let out = user
        .command(&client.display().to_string())
        .args(["--exact", "foreign_client_registers", "--nocapture"])
        .env(CHILD_SOCKET, agent.socket())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("foreign-status="))
        .unwrap_or_else(|| {
            panic!(
                "no status from the foreign client: {stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
        .to_owned()
}

#[test]
fn only_allowed_users_register() {
    let Some(user) = other_user_or_skip() else {
        return;
    };
    let me = std::fs::metadata("/proc/self").unwrap().uid();
    let dir = temp_dir("trust");
    let client = client_copy(&dir);
    let port = free_port().to_string();
    let listen = format!("127.0.0.1:{port}");
    let allowed = format!("root,{me}");
    let agent = Agent::start(
        &dir,
        &["--allowed-uids", &allowed, "--metrics-listen", &listen],
    );
    for _ in 0..3 {
        assert_eq!(register_as(&user, &client, &agent), "InvalidRequest");
    }
    // We are listed: served as before.
    let AgentResponse::Register { status, .. } = request(&agent.socket(), register(1, 2)) else {
        panic!("not a registration response")
    };
    assert_eq!(status, AgentStatus::Success);
    let text = metrics(port.parse().unwrap());
    assert!(
        text.contains("mpib_agent_bad_clients_total{host=")
            && text
                .lines()
                .any(|l| l.contains("reason=\"not_allowed\"") && l.ends_with(" 3")),
        "{text}"
    );
    let line = format!(
        "registration refused: uid {} ({}) (pid ",
        user.uid, user.name
    );
    let log = agent.log_text();
    assert_eq!(log.matches(&line).count(), 1, "one WARN per uid: {log}");
    assert!(log.contains("is not allowed by --allowed-uids"), "{log}");
    assert!(agent.status().contains("slots 1/256"));
    drop(agent);

    // Listed by uid, or by the gid it connects with: served.
    let uid = user.uid.to_string();
    let gid = user.gid.to_string();
    let by_uid: [&str; 2] = ["--allowed-uids", &uid];
    let by_gid: [&str; 4] = ["--allowed-uids", "0", "--allowed-gids", &gid];
    for flags in [&by_uid[..], &by_gid[..]] {
        let agent = Agent::start(&dir, flags);
        assert_eq!(register_as(&user, &client, &agent), "Success", "{flags:?}");
        assert!(!agent.log_text().contains("registration refused"));
        drop(agent);
    }
}

#[test]
fn the_variable_applies_and_bad_lists_exit_2_naming_them() {
    // Only another uid allowed, by the variable: even we are refused.
    let me = std::fs::metadata("/proc/self").unwrap().uid();
    let dir = temp_dir("trust-env");
    let other = (me + 1).to_string();
    let agent = Agent::start_with_env(&dir, &[], &[("MPIB_AGENT_ALLOWED_UIDS", &other)]);
    let AgentResponse::Register { status, .. } = request(&agent.socket(), register(1, 2)) else {
        panic!("not a registration response")
    };
    assert_eq!(status, AgentStatus::InvalidRequest);
    assert!(agent
        .log_text()
        .contains(&format!("registration refused: uid {me}")));
    drop(agent);

    let run = |args: &[&str], vars: &[(&str, &str)]| {
        let out = Command::new(env!("CARGO_BIN_EXE_mpib-agent"))
            .args(args)
            .arg("--hint-path")
            .arg(dir.join("hints"))
            .env_remove("MPIB_AGENT_CONFIG")
            .envs(vars.iter().copied())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        err
    };
    let err = run(&["--allowed-uids", "root,nobody-mpib-x"], &[]);
    assert!(
        err.contains("--allowed-uids: no user named \"nobody-mpib-x\""),
        "{err}"
    );
    let err = run(&[], &[("MPIB_AGENT_ALLOWED_GIDS", "0,,1")]);
    assert!(
        err.contains("MPIB_AGENT_ALLOWED_GIDS: \"0,,1\" has an empty entry"),
        "{err}"
    );
    let config = dir.join("bad.toml");
    std::fs::write(&config, "allowed_gids = \"no-group-mpib-x\"\n").unwrap();
    let err = run(&["--config", config.to_str().unwrap()], &[]);
    assert!(err.contains("allowed_gids: no group named"), "{err}");
}
