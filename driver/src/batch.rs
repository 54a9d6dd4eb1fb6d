//! Connection setup in NCCL's order for a batch, as `ncclTransportP2pSetup` (NCCL's
//! `transport.cc`) runs it: the receive side's setup (`listen`) for every connection of the
//! batch first, the handles exchanged, then `connect` and `accept` polled round-robin over the
//! whole batch until every one is up, each listen comm closed once its `accept` returned a comm
//! (docs/NCCL_NET_ABI.md "Connection setup"). [`crate::Pair`] connects one pair at a time, which
//! hides what a batch costs: every listen open at once, every handshake started together.

use std::time::{Duration, Instant};

use crate::abi::HANDLE_SIZE;
use crate::error::{Error, Result};
use crate::net::{ListenComm, Net, NetCtx, RecvComm, SendComm};

/// A batch's comms, in the order of their listens.
pub struct Batch {
    /// The connected send comms.
    pub sends: Vec<SendComm>,
    /// The accepted receive comms.
    pub recvs: Vec<RecvComm>,
    /// Per pair, from the first `connect` call to the call that returned its comm.
    pub connect_times: Vec<Duration>,
}

impl Batch {
    /// Closes every comm of the batch, sends first; the first failure is returned after the
    /// others are closed.
    pub fn close(self, net: &Net<'_>) -> Result<()> {
        let closed_sends = self.sends.into_iter().map(|send| net.close_send(send));
        let closed_recvs = self.recvs.into_iter().map(|recv| net.close_recv(recv));
        let results: Vec<Result<()>> = closed_sends.chain(closed_recvs).collect();
        results.into_iter().collect()
    }
}

/// What is open of a batch while it is being set up.
struct Open {
    listens: Vec<Option<ListenComm>>,
    handles: Vec<[u8; HANDLE_SIZE]>,
    sends: Vec<Option<SendComm>>,
    recvs: Vec<Option<RecvComm>>,
    connect_times: Vec<Option<Duration>>,
}

impl Open {
    /// Closes everything opened (a failed batch).
    fn close(self, net: &Net<'_>) {
        for listen in self.listens.into_iter().flatten() {
            let _ = net.close_listen(listen);
        }
        for send in self.sends.into_iter().flatten() {
            let _ = net.close_send(send);
        }
        for recv in self.recvs.into_iter().flatten() {
            let _ = net.close_recv(recv);
        }
    }
}

/// `count` connections from `send_ctx` to `recv_ctx` on device `dev`, set up in NCCL's batch
/// order within `deadline`; on a failure everything opened is closed and the error names the
/// call and the connection.
pub fn connect_batch(
    net: &Net<'_>,
    send_ctx: &NetCtx,
    recv_ctx: &NetCtx,
    dev: i32,
    count: usize,
    deadline: Duration,
) -> Result<Batch> {
    let mut open = Open {
        listens: Vec::with_capacity(count),
        handles: vec![[0u8; HANDLE_SIZE]; count],
        sends: (0..count).map(|_| None).collect(),
        recvs: (0..count).map(|_| None).collect(),
        connect_times: vec![None; count],
    };
    for index in 0..count {
        match net.listen(recv_ctx, dev, &mut open.handles[index]) {
            Ok(listen) => open.listens.push(Some(listen)),
            Err(e) => {
                open.close(net);
                return Err(e.context(format!("listen {index} of a batch of {count}")));
            }
        }
    }
    let started = Instant::now();
    let mut done = 0;
    while done < 2 * count {
        if started.elapsed() > deadline {
            let (sent, accepted) = (
                open.sends.iter().flatten().count(),
                open.recvs.iter().flatten().count(),
            );
            open.close(net);
            return Err(Error::Timeout(format!(
                "a batch of {count}: {sent} connected and {accepted} accepted after {deadline:?}"
            )));
        }
        match round(net, send_ctx, dev, &mut open, started) {
            Ok(progress) => done += progress,
            Err(e) => {
                open.close(net);
                return Err(e);
            }
        }
    }
    Ok(Batch {
        sends: open.sends.into_iter().flatten().collect(),
        recvs: open.recvs.into_iter().flatten().collect(),
        connect_times: open.connect_times.into_iter().flatten().collect(),
    })
}

/// One pass over the batch: `connect` then `accept` for each connection not up yet; how many
/// came up.
fn round(
    net: &Net<'_>,
    send_ctx: &NetCtx,
    dev: i32,
    open: &mut Open,
    started: Instant,
) -> Result<usize> {
    let count = open.handles.len();
    let mut progress = 0;
    for index in 0..count {
        if open.sends[index].is_none() {
            let comm = net
                .connect(send_ctx, dev, &mut open.handles[index])
                .map_err(|e| e.context(format!("connect {index} of a batch of {count}")))?;
            if comm.is_some() {
                open.sends[index] = comm;
                open.connect_times[index] = Some(started.elapsed());
                progress += 1;
            }
        }
        if open.recvs[index].is_none() {
            let listen = open.listens[index].as_ref().expect("open until accepted");
            let comm = net
                .accept(listen)
                .map_err(|e| e.context(format!("accept {index} of a batch of {count}")))?;
            if comm.is_some() {
                open.recvs[index] = comm;
                let listen = open.listens[index].take().expect("open until accepted");
                net.close_listen(listen)
                    .map_err(|e| e.context(format!("closeListen {index} of a batch of {count}")))?;
                progress += 1;
            }
        }
    }
    Ok(progress)
}
