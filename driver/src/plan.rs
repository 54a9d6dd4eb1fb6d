//! What one data exchange posts: grouped receives in FIFO order, sends in a chosen order, and
//! where every byte lives in the two registered regions.

/// Gap of poisoned bytes after every receive buffer (catches writes past the message).
pub const GUARD: usize = 64;

/// One buffer of a grouped receive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvSpec {
    /// Offset in the receive region.
    pub offset: usize,
    /// Capacity posted.
    pub capacity: usize,
    /// Tag.
    pub tag: i32,
    /// Index (in [`Plan::sends`]) of the send whose bytes land here.
    pub source: usize,
}

/// One `isend`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendSpec {
    /// Offset in the send region.
    pub offset: usize,
    /// Bytes sent.
    pub size: usize,
    /// Tag.
    pub tag: i32,
}

/// A complete exchange.
#[derive(Clone, Debug)]
pub struct Plan {
    /// What the failure messages call it (`"size 4097"`, `"grouped n=3"`, …).
    pub label: String,
    /// Grouped receives, posted in this order (each `irecv` has `1..=8` buffers).
    pub recvs: Vec<Vec<RecvSpec>>,
    /// Sends, posted in this order.
    pub sends: Vec<SendSpec>,
    /// At most this many `irecv` requests outstanding (NCCL: 32 per comm).
    pub max_recvs_in_flight: usize,
    /// At most this many `isend` requests outstanding (plugin slots: 256).
    pub max_sends_in_flight: usize,
    /// Pre-set `*request = (void*)1` before each single-buffer `irecv` (NCCL's LL path).
    pub preset_recv_request: bool,
    /// Pass `sizes = NULL` to `test` on send requests.
    pub null_send_sizes: bool,
    /// Pass `sizes = NULL` to `test` on receive requests (bootstrap-over-net does; sizes are then
    /// not checked, bytes still are).
    pub null_recv_sizes: bool,
}

fn align_up(value: usize, to: usize) -> usize {
    value.div_ceil(to) * to
}

impl Plan {
    /// Bytes of send region needed.
    pub fn send_len(&self) -> usize {
        self.sends
            .iter()
            .map(|s| s.offset + s.size)
            .max()
            .unwrap_or(0)
            .max(1)
    }

    /// Bytes of receive region needed (guards included).
    pub fn recv_len(&self) -> usize {
        let end = self
            .recvs
            .iter()
            .flatten()
            .map(|r| r.offset + r.capacity + GUARD)
            .max();
        end.unwrap_or(0).max(1)
    }

    /// Total payload bytes.
    pub fn payload_bytes(&self) -> usize {
        self.sends.iter().map(|s| s.size).sum()
    }

    /// One message of `size` bytes into a receive of the same capacity.
    pub fn single(size: usize) -> Plan {
        Plan::grouped(&[size], &[0], &[0]).labelled(format!("size {size}"))
    }

    /// One grouped receive of `sizes.len()` buffers with `tags`; the sends are posted in
    /// `send_order` (indices into `sizes`).
    pub fn grouped(sizes: &[usize], tags: &[i32], send_order: &[usize]) -> Plan {
        let label = format!(
            "grouped n={} tags {tags:?} send order {send_order:?}",
            sizes.len()
        );
        Plan::streams(1, sizes, tags, send_order, 1, sizes.len()).labelled(label)
    }

    /// `groups` grouped receives, each like [`Plan::grouped`], with at most `max_recvs` receives
    /// and `max_sends` sends in flight. Every send has its own bytes (no buffer reuse).
    pub fn streams(
        groups: usize,
        sizes: &[usize],
        tags: &[i32],
        send_order: &[usize],
        max_recvs: usize,
        max_sends: usize,
    ) -> Plan {
        assert!(sizes.len() == tags.len() && sizes.len() == send_order.len());
        let (mut recvs, mut sends) = (Vec::new(), Vec::new());
        let (mut send_at, mut recv_at) = (0usize, 0usize);
        for _ in 0..groups {
            let first_send = sends.len();
            for &i in send_order {
                sends.push(SendSpec {
                    offset: send_at,
                    size: sizes[i],
                    tag: tags[i],
                });
                send_at = align_up(send_at + sizes[i], 64);
            }
            let mut group = Vec::new();
            for (i, (&size, &tag)) in sizes.iter().zip(tags).enumerate() {
                let position = send_order
                    .iter()
                    .position(|&o| o == i)
                    .expect("a permutation");
                let source = first_send + position;
                group.push(RecvSpec {
                    offset: recv_at,
                    capacity: size,
                    tag,
                    source,
                });
                recv_at = align_up(recv_at + size + GUARD, 64);
            }
            recvs.push(group);
        }
        Plan {
            label: format!("{groups} x grouped n={}", sizes.len()),
            recvs,
            sends,
            max_recvs_in_flight: max_recvs.max(1),
            max_sends_in_flight: max_sends.max(1),
            preset_recv_request: false,
            null_send_sizes: false,
            null_recv_sizes: false,
        }
    }

    /// `count` single-buffer messages of `size_of(i)` bytes, pipelined.
    pub fn pipeline(count: usize, size_of: impl Fn(usize) -> usize, max_in_flight: usize) -> Plan {
        let (mut recvs, mut sends) = (Vec::new(), Vec::new());
        let (mut send_at, mut recv_at) = (0usize, 0usize);
        for i in 0..count {
            let size = size_of(i);
            sends.push(SendSpec {
                offset: send_at,
                size,
                tag: 0,
            });
            recvs.push(vec![RecvSpec {
                offset: recv_at,
                capacity: size,
                tag: 0,
                source: i,
            }]);
            send_at = align_up(send_at + size, 64);
            recv_at = align_up(recv_at + size + GUARD, 64);
        }
        Plan {
            label: format!("pipeline of {count}"),
            recvs,
            sends,
            max_recvs_in_flight: max_in_flight.max(1),
            max_sends_in_flight: max_in_flight.max(1),
            preset_recv_request: false,
            null_send_sizes: false,
            null_recv_sizes: false,
        }
    }

    /// Posts receives larger than the messages, as NCCL does (its capacities are protocol buffer
    /// slots; the receiver learns each real size from the sender): each capacity becomes
    /// `capacity(size)` (at least the size), and the receive region is laid out again.
    pub fn with_capacities(mut self, capacity: impl Fn(usize) -> usize) -> Plan {
        let mut recv_at = 0usize;
        for r in self.recvs.iter_mut().flatten() {
            let size = self.sends[r.source].size;
            r.capacity = capacity(size).max(size);
            r.offset = recv_at;
            recv_at = align_up(recv_at + r.capacity + GUARD, 64);
        }
        self.label = format!("{} (receive capacities larger than messages)", self.label);
        self
    }

    /// Renames the plan (failure messages use the label).
    pub fn labelled(mut self, label: impl Into<String>) -> Plan {
        self.label = label.into();
        self
    }

    /// Sets the in-flight limits.
    pub fn in_flight(mut self, max_recvs: usize, max_sends: usize) -> Plan {
        self.max_recvs_in_flight = max_recvs.max(1);
        self.max_sends_in_flight = max_sends.max(1);
        self
    }

    /// Pre-set `*request = (void*)1` on single-buffer receives.
    pub fn with_preset_request(mut self) -> Plan {
        self.preset_recv_request = true;
        self
    }

    /// Test sends and receives with `sizes = NULL`.
    pub fn with_null_sizes(mut self) -> Plan {
        self.null_send_sizes = true;
        self.null_recv_sizes = true;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grouped_sources_follow_tags() {
        let plan = Plan::grouped(&[10, 20, 30], &[7, 8, 9], &[2, 0, 1]);
        assert_eq!(
            plan.sends.iter().map(|s| s.tag).collect::<Vec<_>>(),
            [9, 7, 8]
        );
        for r in &plan.recvs[0] {
            let s = plan.sends[r.source];
            assert_eq!((s.tag, s.size), (r.tag, r.capacity));
        }
        let streams = Plan::streams(3, &[1, 2], &[0, 1], &[1, 0], 32, 256);
        assert_eq!(streams.recvs.len(), 3);
        assert_eq!(streams.sends.len(), 6);
        assert_eq!(streams.recvs[2][0].source, 5);
        let wide = Plan::grouped(&[10, 0], &[1, 2], &[1, 0]).with_capacities(|s| s + 4096);
        assert_eq!(wide.recvs[0][0].capacity, 4106);
        assert_eq!(wide.recvs[0][1].offset, 4224);
        let single = Plan::single(0);
        assert_eq!((single.send_len(), single.recv_len()), (1, GUARD));
    }
}
