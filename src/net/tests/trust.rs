//! The agent's user (docs/SECURITY.md, 'The plugin'): a socket file of a trusted user in a trusted
//! directory, but listened on by another user's process, is refused by its `SO_PEERCRED` uid. The
//! path checks themselves are proven through the driver (`tests/trust.rs`).

use socket2::{Domain, SockAddr, Socket, Type};

use mpib_driver::other_user::other_user_or_skip;

use crate::net::agent::registration::{connect_trusted, Unreachable};
use crate::net::tests::{close, connect_pair, env_lock, transfer};
use crate::params::Settings;

/// `listen()` on `socket` with `uid` as the effective uid of this thread only, so the kernel
/// records `uid` as the listener's credentials; the thread takes root back afterwards.
fn listen_as(socket: &Socket, uid: u32) {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let setresuid = |euid: libc::c_long| {
                    // SAFETY: the raw syscall changes the calling thread's credentials only (glibc's
                    // setresuid would change every thread's); -1 keeps the real and saved uids (0),
                    // so the thread can take euid 0 back.
                    let rc = unsafe { libc::syscall(libc::SYS_setresuid, -1, euid, -1) };
                    assert_eq!(rc, 0, "setresuid: {}", std::io::Error::last_os_error());
                };
                setresuid(libc::c_long::from(uid));
                let listened = socket.listen(8);
                setresuid(0);
                listened.unwrap();
            })
            .join()
            .unwrap();
    });
}

#[test]
fn an_agent_listening_as_another_user_is_refused_by_its_peer_uid() {
    let Some(user) = other_user_or_skip() else {
        return;
    };
    let _guard = env_lock();
    let dir = mpib_driver::temp_dir("mpib-peercred").unwrap();
    let path = dir.join("agent.sock");
    let hints = dir.join("hints");
    let socket = Socket::new(Domain::UNIX, Type::STREAM, None).unwrap();
    socket.bind(&SockAddr::unix(&path).unwrap()).unwrap();
    listen_as(&socket, user.uid);
    let vars = [
        ("MPIB_FABRIC", "loopback"),
        ("MPIB_MODE", "1"),
        ("MPIB_AGENT_SOCKET", path.to_str().unwrap()),
        ("MPIB_HINT_PATH", hints.to_str().unwrap()),
    ];
    let mut settings = Settings::from_lookup(|name| {
        vars.iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| (*v).to_owned())
    })
    .unwrap();
    match connect_trusted(&settings) {
        Err(Unreachable::Refused(why)) => {
            let expected = format!(
                "MPIB_AGENT_SOCKET {}: the agent serving it runs as uid {} (mpib-other); expected \
                 root",
                path.display(),
                user.uid
            );
            assert!(why.starts_with(&expected), "{why}");
        }
        Err(Unreachable::Unavailable(e)) => panic!("refused as unavailable: {e}"),
        Ok(_) => panic!("an agent running as {} was trusted", user.name),
    }
    // An agent run as a dedicated user is trusted when MPIB_TRUSTED_UIDS names it.
    settings.trusted_uids = vec![user.uid];
    assert!(connect_trusted(&settings).is_ok());
    // Through connect/accept: the pair comes up without a slot and moves data all on SOUT.
    let pair = connect_pair(&vars[1..]);
    assert!(pair.send.info.agent.is_none() && pair.recv.info.agent.is_none());
    for size in [0, 4097, 1 << 20] {
        transfer(&pair, size);
    }
    close(pair);
    drop(socket);
    std::fs::remove_dir_all(&dir).unwrap();
}
