//! One connection of a rank as NCCL's proxy drives it: its comm, its registered buffer cut into
//! slots of one slice, the transfers of the current op in order, and the requests in flight
//! (NCCL_STEPS / slice-steps at most, the oldest tested each pass).

use std::collections::VecDeque;

use super::schedule::{Receive, Send, Steps, ELEMENT};
use crate::abi::NCCL_PTR_HOST;
use crate::error::{Error, Result};
use crate::net::{DataComm, MemHandle, Net, RecvBuf, RecvComm, Request, SendComm};

/// A comm that can be closed on its own (a send or a receive comm).
pub trait Closable: Sized {
    fn close(self, net: &Net<'_>) -> Result<()>;
}

impl Closable for SendComm {
    fn close(self, net: &Net<'_>) -> Result<()> {
        net.close_send(self)
    }
}

impl Closable for RecvComm {
    fn close(self, net: &Net<'_>) -> Result<()> {
        net.close_recv(self)
    }
}

/// A connection, its buffer and where its transfers stand.
pub struct Lane<C, T> {
    comm: C,
    bytes: Vec<u8>,
    slot: usize,
    handle: Option<MemHandle>,
    transfers: Vec<T>,
    posted: usize,
    requests: VecDeque<Request>,
    completed: usize,
}

impl<C: DataComm, T: Copy> Lane<C, T> {
    /// `comm` with its buffer of NCCL_STEPS steps, registered on it; a failed registration
    /// closes `comm` (its error is the registration's).
    pub fn new(net: &Net<'_>, comm: C, steps: Steps) -> Result<Lane<C, T>>
    where
        C: Closable,
    {
        let mut bytes = vec![0u8; steps.step * 8];
        let (data, size) = (bytes.as_mut_ptr(), bytes.len());
        // SAFETY: the buffer lives in the lane until `close` deregisters it first (or leaks it
        // while requests may still point into it).
        let registered = unsafe { net.reg_mr(&comm, data.cast(), size, NCCL_PTR_HOST) };
        let handle = match registered {
            Ok(handle) => handle,
            Err(error) => {
                let _ = comm.close(net);
                return Err(error);
            }
        };
        Ok(Lane {
            comm,
            bytes,
            slot: steps.slice(),
            handle: Some(handle),
            transfers: Vec::new(),
            posted: 0,
            requests: VecDeque::new(),
            completed: 0,
        })
    }

    /// The next op's transfers.
    pub fn start(&mut self, transfers: Vec<T>) {
        self.transfers = transfers;
        self.posted = 0;
        self.completed = 0;
    }

    /// Transfers completed in this op.
    pub fn completed(&self) -> usize {
        self.completed
    }

    pub fn finished(&self) -> bool {
        self.completed == self.transfers.len()
    }

    fn window(&self) -> usize {
        self.bytes.len() / self.slot
    }

    fn slot_ptr(&mut self, index: usize) -> *mut u8 {
        let at = (index % self.window()) * self.slot;
        self.bytes[at..].as_mut_ptr()
    }

    fn handle(&self) -> Result<&MemHandle> {
        (self.handle.as_ref())
            .ok_or_else(|| Error::Contract("the lane's buffer is not registered".into()))
    }

    /// Deregisters the buffer and closes the comm. A buffer requests may still point into is
    /// leaked, never freed.
    pub fn close(mut self, net: &Net<'_>) -> Result<()>
    where
        C: Closable,
    {
        if !self.requests.is_empty() {
            std::mem::forget(std::mem::take(&mut self.bytes));
        }
        let deregistered = match self.handle.take() {
            Some(handle) => net.dereg_mr(&self.comm, handle),
            None => Ok(()),
        };
        let closed = self.comm.close(net);
        deregistered.and(closed)
    }
}

impl Lane<SendComm, Send> {
    /// Posts the sends whose data is ready (`landed`: receives completed on the connection they
    /// wait for) while a slot is free, then tests the oldest.
    pub fn progress_sends(
        &mut self,
        net: &Net<'_>,
        tag: i32,
        data: &[u32],
        landed: usize,
    ) -> Result<()> {
        while let Some(send) = self.transfers.get(self.posted).copied() {
            if self.requests.len() >= self.window() || send.after.is_some_and(|r| r >= landed) {
                break;
            }
            let slot = self.slot_ptr(self.posted);
            let words = &data[send.offset / ELEMENT..(send.offset + send.length) / ELEMENT];
            // SAFETY: a slot holds a slice and a transfer is a slice at most.
            unsafe {
                std::ptr::copy_nonoverlapping(words.as_ptr().cast::<u8>(), slot, send.length)
            };
            // SAFETY: the slot stays allocated and untouched until the request completes.
            let posted =
                unsafe { net.isend(&self.comm, slot.cast(), send.length, tag, self.handle()?) }?;
            let Some(request) = posted else {
                break; // again later, as NCCL retries a NULL request
            };
            self.requests.push_back(request);
            self.posted += 1;
        }
        if let Some(request) = self.requests.front() {
            if net.test(request, None)? {
                self.requests.pop_front();
                self.completed += 1;
            }
        }
        Ok(())
    }
}

impl Lane<RecvComm, Receive> {
    /// Keeps the receives posted ahead (tagged `tag`, the sender's rank), tests the oldest and
    /// lands it in `data`.
    pub fn progress_receives(&mut self, net: &Net<'_>, tag: i32, data: &mut [u32]) -> Result<()> {
        while self.posted < self.transfers.len() && self.requests.len() < self.window() {
            let buffer = RecvBuf {
                data: self.slot_ptr(self.posted).cast(),
                size: self.slot,
                tag,
                mhandle: self.handle()?.as_ptr(),
            };
            // SAFETY: the slot stays allocated and unread until the request completes.
            let Some(request) = (unsafe { net.irecv(&self.comm, &[buffer]) })? else {
                break;
            };
            self.requests.push_back(request);
            self.posted += 1;
        }
        let Some(request) = self.requests.front() else {
            return Ok(());
        };
        let mut sizes = [0i32; 64];
        if !net.test(request, Some(&mut sizes))? {
            return Ok(());
        }
        self.requests.pop_front();
        let receive = self.transfers[self.completed];
        if usize::try_from(sizes[0]).ok() != Some(receive.length) {
            return Err(Error::Mismatch(format!(
                "receive {} reported {} bytes, the schedule sends {}",
                self.completed, sizes[0], receive.length
            )));
        }
        let slot = self.slot_ptr(self.completed);
        land(data, slot, receive);
        self.completed += 1;
        Ok(())
    }
}

/// Adds (or copies) a received slice into the rank's words.
fn land(data: &mut [u32], slot: *const u8, receive: Receive) {
    let words = &mut data[receive.offset / ELEMENT..(receive.offset + receive.length) / ELEMENT];
    for (index, word) in words.iter_mut().enumerate() {
        // SAFETY: the slot holds `receive.length` bytes the peer wrote; read unaligned.
        let got = unsafe { slot.add(index * ELEMENT).cast::<u32>().read_unaligned() };
        *word = if receive.reduce {
            word.wrapping_add(got)
        } else {
            got
        };
    }
}
