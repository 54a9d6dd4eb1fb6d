//! A TCP rail's memory registrations, and how a peer's bytes land in them.
//!
//! The fabric thread writes into registered memory only after finding a live registration of
//! the rail whose key, range and rights cover the write; the check and the write happen under
//! the registry's read lock, so a registration cannot go away between them (deregistration takes
//! the write lock). Large payloads are received by `recv(2)` straight into the region (the kernel
//! reports EFAULT rather than faulting on a bad page); small ones, which may be control memory
//! that the engine polls (CTS entries, completion records), are staged and then landed in
//! ascending address order with atomic stores (src/fabric/landing.rs).

use std::collections::BTreeMap;

use crate::fabric::{Access, MemoryKeys};

/// One registration.
#[derive(Clone, Copy, Debug)]
struct Registration {
    addr: u64,
    len: u64,
    access: Access,
    keys: MemoryKeys,
}

impl Registration {
    fn covers(&self, addr: u64, len: u64) -> bool {
        addr >= self.addr
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= self.addr + self.len)
    }
}

/// What a remote request needs of a registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum RemoteRight {
    /// RDMA WRITE into it.
    Write,
    /// RDMA READ from it.
    Read,
}

/// The registrations of one rail, by local key, with each remote key's local key beside: every
/// write a peer sends is checked here, and a process of thousands of connections has thousands
/// of registrations per rail (a scan made each check grow with them: issue 22).
#[derive(Debug, Default)]
pub(super) struct Registry {
    by_lkey: BTreeMap<u32, Registration>,
    lkey_of_rkey: BTreeMap<u32, u32>,
}

impl Registry {
    /// Adds a registration.
    pub(super) fn add(&mut self, addr: u64, len: u64, access: Access, keys: MemoryKeys) {
        self.by_lkey.insert(
            keys.lkey,
            Registration {
                addr,
                len,
                access,
                keys,
            },
        );
        self.lkey_of_rkey.insert(keys.rkey, keys.lkey);
    }

    /// Removes the registration with exactly these keys; `false` when there is none.
    pub(super) fn remove(&mut self, keys: MemoryKeys) -> bool {
        if self.by_lkey.get(&keys.lkey).map(|r| r.keys) != Some(keys) {
            return false;
        }
        self.by_lkey.remove(&keys.lkey);
        self.lkey_of_rkey.remove(&keys.rkey);
        true
    }

    /// Whether `[addr, addr + len)` lies in a registration whose local key is `lkey`.
    pub(super) fn local(&self, lkey: u32, addr: u64, len: u64) -> bool {
        len == 0 || self.by_lkey.get(&lkey).is_some_and(|r| r.covers(addr, len))
    }

    /// Whether a peer may `right` `[addr, addr + len)` under `rkey`. A zero-byte write checks
    /// no key, as on hardware.
    pub(super) fn remote(&self, rkey: u32, addr: u64, len: u64, right: RemoteRight) -> bool {
        if len == 0 {
            return true;
        }
        let registration = self
            .lkey_of_rkey
            .get(&rkey)
            .and_then(|lkey| self.by_lkey.get(lkey));
        registration.is_some_and(|r| {
            r.covers(addr, len)
                && match right {
                    RemoteRight::Write => r.access.remote_write,
                    RemoteRight::Read => r.access.remote_read,
                }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(n: u32) -> MemoryKeys {
        MemoryKeys {
            lkey: n,
            rkey: n + 1,
        }
    }

    #[test]
    fn remote_writes_need_the_key_the_range_and_the_right() {
        let mut registry = Registry::default();
        registry.add(0x1000, 0x100, Access::DATA, keys(0x10));
        registry.add(0x4000, 0x100, Access::LOCAL, keys(0x20));
        assert!(registry.remote(0x11, 0x1000, 0x100, RemoteRight::Write));
        assert!(registry.remote(0x11, 0x10ff, 1, RemoteRight::Read));
        assert!(
            !registry.remote(0x11, 0x10ff, 2, RemoteRight::Write),
            "past the end"
        );
        assert!(
            !registry.remote(0x10, 0x1000, 1, RemoteRight::Write),
            "an lkey is no rkey"
        );
        assert!(
            !registry.remote(0x21, 0x4000, 1, RemoteRight::Write),
            "local-only memory"
        );
        assert!(
            registry.remote(0x99, 0, 0, RemoteRight::Write),
            "zero bytes check no key"
        );
        assert!(registry.local(0x20, 0x4000, 0x100));
        assert!(!registry.local(0x21, 0x4000, 1));
        assert!(registry.remove(keys(0x10)));
        assert!(!registry.remove(keys(0x10)));
        assert!(
            !registry.remote(0x11, 0x1000, 1, RemoteRight::Write),
            "removed"
        );
    }
}
