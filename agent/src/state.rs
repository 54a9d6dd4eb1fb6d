//! The agent's state behind one lock: the slot table, the hint file, each flow's policy state and
//! the counters the metrics and `status` report. Registrations, operator commands and the
//! policy tick each take the lock briefly; none of them does I/O other than the mapped file.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::time::Instant;

use mpib_proto::agent_wire::{AgentRequest, AgentResponse, AgentStatus};

use crate::config::{Policies, Subnet};
use crate::measure::FlowMeasurement;
use crate::policy::{Adaptive, Decision, FlowPolicy, PolicyKind};
use crate::shm::{HintFile, Opened};
use crate::slots::{ConnectionKey, FlowLimits, Pair, Process, Refused, Registered, SlotTable};

/// One flow's agent-side state.
#[derive(Clone, Debug)]
pub struct FlowState {
    /// Its policy and the policy's state.
    pub policy: FlowPolicy,
    /// The share last written.
    pub sup_bw: u32,
    /// Fixed by an operator or another writer; the policy is not consulted.
    pub pinned: Option<u32>,
    /// The last interval's measurement.
    pub measured: FlowMeasurement,
    /// Seconds since the flow last moved data the agent saw.
    pub idle_s: f64,
    /// Whether its connections are intra-island, once a probes file said (kept while none is
    /// seen, so rules by class do not flip the policy when the flow goes idle).
    pub intra: Option<bool>,
}

/// Counters for the metrics.
#[derive(Clone, Debug, Default)]
pub struct Counters {
    /// Registrations by result.
    pub registrations: BTreeMap<&'static str, u64>,
    /// Deregistrations by result.
    pub deregistrations: BTreeMap<&'static str, u64>,
    /// Bad clients by reason.
    pub bad_clients: BTreeMap<&'static str, u64>,
    /// Connections reclaimed by reason.
    pub reclaimed: BTreeMap<&'static str, u64>,
    /// Share changes by (policy, reason).
    pub decisions: BTreeMap<(&'static str, &'static str), u64>,
    /// Entries changed by another writer.
    pub external_writes: u64,
    /// Reloads by result.
    pub reloads: BTreeMap<&'static str, u64>,
}

/// Everything behind the lock.
pub struct State {
    /// Flows and connections.
    pub slots: SlotTable,
    /// The mapped hint file.
    pub hints: HintFile,
    /// Per-flow state by slot.
    pub flows: BTreeMap<u32, FlowState>,
    /// Counters.
    pub counters: Counters,
    /// Live probes files on the last tick.
    pub probes_files: usize,
    /// When the agent started.
    pub started: Instant,
    /// Slots a live connection reads, per the probes files of the last tick (`None` until they
    /// have been read once after a start).
    pub in_use: Option<BTreeSet<u32>>,
    /// Uids refused as not allowed so far: each is logged once, not once per connection.
    pub refused_uids: BTreeSet<u32>,
    /// Registrations refused for a flow limit, logged at most once per [`LIMIT_LOG_EVERY`].
    pub limit_refusals: RateLimited,
    /// Refusals for the caller to log once it has unlocked ([`State::take_log`]).
    pub log: Vec<LimitRefusal>,
}

/// A registration refused for a flow limit, due to be logged: the facts only. The line is
/// written by [`LimitRefusal::line`] after the state is unlocked, since naming the user runs
/// `getent` (a child process, NSS perhaps over the network) and the lock is on the path of every
/// registration and of the policy loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitRefusal {
    /// [`Refused::ProcessLimit`] or [`Refused::UserLimit`].
    pub refused: Refused,
    /// The refused process.
    pub process: Process,
    /// The flows the process (or its user) had connections in.
    pub flows: usize,
    /// The limit it reached.
    pub limit: usize,
    /// Refusals for a flow limit since the previous line, this one included.
    pub count: u64,
}

impl LimitRefusal {
    /// The WARN line (a user limit names the user: call without the state locked).
    pub fn line(&self) -> String {
        let LimitRefusal {
            process,
            flows,
            limit,
            count,
            ..
        } = *self;
        let (result, what) = if self.refused == Refused::UserLimit {
            (
                "user_limit",
                format!(
                    "{} (pid {}) has connections in {flows} flow(s), the per-user limit while \
                     another user has connections (--max-flows-per-user, \
                     MPIB_AGENT_MAX_FLOWS_PER_USER, max_flows_per_user = {limit})",
                    crate::access::user_label(process.uid),
                    process.pid,
                ),
            )
        } else {
            (
                "process_limit",
                format!(
                    "pid {} has connections in {flows} flow(s), the per-process limit \
                     (--max-flows-per-process, MPIB_AGENT_MAX_FLOWS_PER_PROCESS, \
                     max_flows_per_process = {limit})",
                    process.pid,
                ),
            )
        };
        format!(
            "registration of a new flow refused: {what}; answered status 1 (no free slots), the \
             connection runs all-SOUT; {count} refusal(s) for a flow limit since the last such \
             line (mpib_agent_registrations_total{{result=\"{result}\"}})"
        )
    }
}

/// How often a refusal for a flow limit is logged at most: a client past its limit retries on
/// every connection, and NCCL opens hundreds.
pub const LIMIT_LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Events logged at most once per period, each line with the count since the previous one.
#[derive(Clone, Debug, Default)]
pub struct RateLimited {
    last_logged: Option<Instant>,
    unlogged: u64,
}

impl RateLimited {
    /// Counts one event at `now`; the count to log (this one included) when a line is due.
    pub fn note(&mut self, now: Instant, every: std::time::Duration) -> Option<u64> {
        self.unlogged += 1;
        let due = self
            .last_logged
            .map_or(true, |at| now.saturating_duration_since(at) >= every);
        if !due {
            return None;
        }
        self.last_logged = Some(now);
        Some(std::mem::take(&mut self.unlogged))
    }
}

impl Counters {
    /// Every known label value at 0, so that each series exists from the start (a `rate()` or
    /// an alert on the first increase then sees it).
    pub fn zeroed() -> Counters {
        let zeros = |keys: &[&'static str]| keys.iter().map(|k| (*k, 0)).collect();
        Counters {
            registrations: zeros(&[
                "ok",
                "no_free_slots",
                "process_limit",
                "user_limit",
                "invalid",
            ]),
            deregistrations: zeros(&["ok", "unknown"]),
            bad_clients: zeros(&[
                "short",
                "wrong_magic",
                "wrong_type",
                "wrong_length",
                "silent",
                "no_credentials",
                "not_allowed",
                "busy",
            ]),
            reclaimed: zeros(&["process_exited", "orphan_unused"]),
            reloads: zeros(&["ok", "error"]),
            ..Counters::default()
        }
    }
}

fn bump<K: Ord>(map: &mut BTreeMap<K, u64>, key: K) {
    *map.entry(key).or_default() += 1;
}

impl State {
    /// Open a damaged hint file again (repairing it) and write every flow's address pair and
    /// last share back.
    ///
    /// # Errors
    ///
    /// The file cannot be opened again; the damaged mapping stays.
    pub fn repair_hints(&mut self) -> Result<Opened, String> {
        let opened = self.hints.reopen()?;
        for flow in self.slots.flows() {
            let slot = flow.slot as usize;
            self.hints.write_flow(slot, flow.pair.src, flow.pair.dst);
            let share = self
                .flows
                .get(&flow.slot)
                .map_or(0, |f| f.pinned.unwrap_or(f.sup_bw));
            self.hints.write_sup_bw(slot, share);
        }
        Ok(opened)
    }

    /// State over `hints`, taking back the flows the file names (a restart).
    pub fn new(hints: HintFile, policies: &Policies) -> State {
        let mut state = State {
            slots: SlotTable::default(),
            hints,
            flows: BTreeMap::new(),
            counters: Counters::zeroed(),
            probes_files: 0,
            started: Instant::now(),
            in_use: None,
            refused_uids: BTreeSet::new(),
            limit_refusals: RateLimited::default(),
            log: Vec::new(),
        };
        for (slot, entry) in state.hints.flows() {
            if entry.seq % 2 == 1 {
                // An agent died in the middle of this write: complete it, or readers would keep
                // failing the seqlock and stay all SOUT.
                state.hints.write_sup_bw(slot, entry.sup_bw);
            }
            let slot = slot as u32;
            let pair = Pair {
                src: entry.src,
                dst: entry.dst,
            };
            if !state.slots.recover(slot, pair) {
                // A second entry for a pair that already has one: stale, cleared.
                state.release(slot);
                continue;
            }
            let mut policy = choose(policies, pair, None);
            if let FlowPolicy::Adaptive(adaptive) = &mut policy {
                adaptive.adopt(entry.sup_bw);
            }
            state.flows.insert(slot, flow_state(policy, entry.sup_bw));
        }
        state
    }

    /// Answers one request from `process`.
    pub fn handle(
        &mut self,
        process: Process,
        request: AgentRequest,
        policies: &Policies,
    ) -> AgentResponse {
        match request {
            AgentRequest::Register {
                conn_id,
                sout_src,
                sout_dst,
                sup_src,
                sup_dst,
            } => self.register(
                ConnectionKey { process, conn_id },
                Pair {
                    src: Ipv4Addr::from(sout_src),
                    dst: Ipv4Addr::from(sout_dst),
                },
                Pair {
                    src: Ipv4Addr::from(sup_src),
                    dst: Ipv4Addr::from(sup_dst),
                },
                policies,
            ),
            AgentRequest::Deregister { conn_id } => self.deregister(process.pid, conn_id),
        }
    }

    fn register(
        &mut self,
        key: ConnectionKey,
        pair: Pair,
        sup: Pair,
        policies: &Policies,
    ) -> AgentResponse {
        if pair.src.is_unspecified() || pair.dst.is_unspecified() {
            bump(&mut self.counters.registrations, "invalid");
            return AgentResponse::Register {
                status: AgentStatus::InvalidRequest,
                hint_slot: 0,
            };
        }
        let limits = policies.flow_limits();
        let registered = self
            .slots
            .register(key, pair, sup, limits)
            .or_else(|refused| {
                if refused != Refused::NoFreeSlots {
                    return Err(refused);
                }
                // Full: only now give up flows taken back after a restart that no live connection
                // reads (freeing them early could hand a slot a running job still reads to another
                // pair, should that job's probes be off).
                let Some(in_use) = self.in_use.as_ref() else {
                    return Err(refused);
                };
                let unused = self.slots.free_unused_recovered(in_use);
                for slot in &unused {
                    self.release(*slot);
                }
                self.reclaimed("orphan_unused", unused.len());
                self.slots.register(key, pair, sup, limits)
            });
        for slot in self.slots.take_freed() {
            self.release(slot);
        }
        let registered = match registered {
            Ok(registered) => registered,
            Err(refused) => return self.refuse_registration(key.process, refused, limits),
        };
        let slot = registered.slot();
        if let Registered::NewFlow(_) = registered {
            let policy = choose(policies, pair, None);
            let rates = configured_rates(policies);
            let share = policy.initial(rates);
            self.hints.write_flow(slot as usize, pair.src, pair.dst);
            self.hints.write_sup_bw(slot as usize, share);
            self.flows.insert(slot, flow_state(policy, share));
        }
        bump(&mut self.counters.registrations, "ok");
        AgentResponse::Register {
            status: AgentStatus::Success,
            hint_slot: slot,
        }
    }

    /// Answers a registration that got no slot: status 1 (no free slots), the plugin's answer
    /// for "no slot for this connection" (it then runs it all-SOUT), counted by reason and,
    /// for a flow limit, queued for the log at most once per [`LIMIT_LOG_EVERY`] with the count.
    /// The rate limit is asked first: a refused client retries on every connection, and a line
    /// not due costs nothing to build.
    fn refuse_registration(
        &mut self,
        process: Process,
        refused: Refused,
        limits: FlowLimits,
    ) -> AgentResponse {
        let answer = AgentResponse::Register {
            status: AgentStatus::NoFreeSlots,
            hint_slot: 0,
        };
        let (result, limit) = match refused {
            Refused::ProcessLimit => ("process_limit", Some(limits.per_process)),
            Refused::UserLimit => ("user_limit", Some(limits.per_user)),
            Refused::NoFreeSlots | Refused::TooManyConnections => ("no_free_slots", None),
        };
        bump(&mut self.counters.registrations, result);
        let Some(limit) = limit else {
            return answer;
        };
        let Some(count) = self.limit_refusals.note(Instant::now(), LIMIT_LOG_EVERY) else {
            return answer;
        };
        let flows = if refused == Refused::UserLimit {
            self.slots.user_flow_count(process.uid)
        } else {
            self.slots.process_flow_count(process)
        };
        self.log.push(LimitRefusal {
            refused,
            process,
            flows,
            limit,
            count,
        });
        answer
    }

    /// The refusals to log, for the caller to write ([`LimitRefusal::line`]) once it has
    /// unlocked the state.
    pub fn take_log(&mut self) -> Vec<LimitRefusal> {
        std::mem::take(&mut self.log)
    }

    fn deregister(&mut self, pid: u32, conn_id: u32) -> AgentResponse {
        let Some(key) = self.slots.find(pid, conn_id) else {
            bump(&mut self.counters.deregistrations, "unknown");
            return AgentResponse::Deregister {
                status: AgentStatus::InvalidRequest,
            };
        };
        if let Some((slot, true)) = self.slots.deregister(key) {
            self.release(slot);
        }
        bump(&mut self.counters.deregistrations, "ok");
        AgentResponse::Deregister {
            status: AgentStatus::Success,
        }
    }

    /// Clears a freed slot's entry.
    pub fn release(&mut self, slot: u32) {
        self.flows.remove(&slot);
        self.hints.write_sup_bw(slot as usize, 0);
        self.hints
            .write_flow(slot as usize, Ipv4Addr::UNSPECIFIED, Ipv4Addr::UNSPECIFIED);
    }

    /// Counts a client closed for bad input.
    pub fn bad_client(&mut self, reason: &'static str) {
        bump(&mut self.counters.bad_clients, reason);
    }

    /// Counts reclaimed connections.
    pub fn reclaimed(&mut self, reason: &'static str, count: usize) {
        *self.counters.reclaimed.entry(reason).or_default() += count as u64;
    }

    /// Counts a reload.
    pub fn reloaded(&mut self, ok: bool) {
        bump(&mut self.counters.reloads, if ok { "ok" } else { "error" });
    }

    /// An operator's `set`: pins `slot` (or every flow) to `share`, or with `None` hands it back
    /// to its policy. Returns the number of flows changed, or an error naming the flow.
    pub fn pin(&mut self, slot: Option<u32>, share: Option<u32>) -> Result<usize, String> {
        let slots: Vec<u32> = match slot {
            Some(s) if self.flows.contains_key(&s) => vec![s],
            Some(s) => return Err(format!("no flow in slot {s} (see mpib-agent status)")),
            None => self.flows.keys().copied().collect(),
        };
        for s in &slots {
            let Some(flow) = self.flows.get_mut(s) else {
                continue;
            };
            flow.pinned = share;
            if let Some(share) = share {
                flow.sup_bw = share;
                self.hints.write_sup_bw(*s as usize, share);
            } else if let FlowPolicy::Adaptive(adaptive) = &mut flow.policy {
                adaptive.adopt(flow.sup_bw);
            }
        }
        Ok(slots.len())
    }

    /// One policy interval over the measured flows.
    /// Returns a line for each decision an operator would want to read about (all but the
    /// routine `balance`, `rule` and `link_rates` moves), for the caller to log after unlocking.
    pub fn tick(
        &mut self,
        measured: &BTreeMap<u32, FlowMeasurement>,
        policies: &Policies,
        interval_ns: u64,
    ) -> Vec<String> {
        let mut notable = Vec::new();
        let slots: Vec<(u32, Pair)> = self.slots.flows().map(|f| (f.slot, f.pair)).collect();
        for (slot, pair) in slots {
            let mut measurement = measured.get(&slot).copied().unwrap_or_default();
            measurement.sample.interval_ns = interval_ns;
            apply_configured_rates(&mut measurement, configured_rates(policies));
            let entry = self.hints.entry(slot as usize);
            let Some(flow) = self.flows.get_mut(&slot) else {
                continue;
            };
            flow.measured = measurement;
            flow.idle_s = if measurement.sample.fresh() {
                0.0
            } else {
                flow.idle_s + interval_ns as f64 / 1e9
            };
            // (A shrunk file reads zeros until the daemon repairs it: not someone's write.)
            if entry.seq % 2 == 0 && entry.sup_bw != flow.sup_bw && !self.hints.damaged() {
                // Someone else wrote the entry (a third-party tool): respect it.
                self.counters.external_writes += 1;
                flow.pinned = Some(entry.sup_bw);
                flow.sup_bw = entry.sup_bw;
            }
            if flow.pinned.is_some() {
                continue;
            }
            if measurement.connections > 0 {
                flow.intra = Some(measurement.intra_island > 0);
            }
            let wanted = choose(policies, pair, flow.intra);
            if !same_policy(&wanted, &flow.policy) {
                flow.policy = wanted;
                if let FlowPolicy::Adaptive(adaptive) = &mut flow.policy {
                    adaptive.adopt(flow.sup_bw);
                }
            }
            let decision = flow
                .policy
                .decide(flow.sup_bw, &measurement.sample, &policies.adaptive);
            if let Decision::Set { sup_bw, reason } = decision {
                if !matches!(reason, "balance" | "rule" | "link_rates") {
                    let sample = &measurement.sample;
                    notable.push(format!(
                        "flow {slot} ({pair}): sup_bw {} -> {sup_bw} ({reason}; rates while busy \
                         SOUT {:.0} MB/s, SUP {:.0} MB/s, retransmissions {:?})",
                        flow.sup_bw,
                        sample.rate(0).unwrap_or(0.0) / 1e6,
                        sample.rate(1).unwrap_or(0.0) / 1e6,
                        sample.retransmissions
                    ));
                }
                flow.sup_bw = sup_bw;
                self.hints.write_sup_bw(slot as usize, sup_bw);
                let key = (flow.policy.kind().name(), reason);
                *self.counters.decisions.entry(key).or_default() += 1;
            }
        }
        notable
    }
}

fn flow_state(policy: FlowPolicy, share: u32) -> FlowState {
    FlowState {
        policy,
        sup_bw: share,
        pinned: None,
        measured: FlowMeasurement::default(),
        idle_s: 0.0,
        intra: None,
    }
}

fn same_policy(a: &FlowPolicy, b: &FlowPolicy) -> bool {
    match (a, b) {
        (FlowPolicy::Static(x), FlowPolicy::Static(y)) => x == y,
        _ => a.kind() == b.kind(),
    }
}

/// Replaces a flow's measured link rates with the configured ones (`[rates]`, where set), each
/// divided among the flows sharing the NIC as the measured speed was (measure.rs,
/// `share_link_rates`): a configured rate is the NIC's, not the flow's.
pub fn apply_configured_rates(measurement: &mut FlowMeasurement, rates: [f64; 2]) {
    for (rail, configured) in rates.into_iter().enumerate() {
        if configured > 0.0 {
            let sharers = measurement.sharers[rail].max(1);
            measurement.sample.link_rate[rail] = configured / f64::from(sharers);
        }
    }
}

/// Configured link rates, bytes per second (0 when not configured).
pub fn configured_rates(policies: &Policies) -> [f64; 2] {
    [
        policies.rates.sout_gbps * 1e9 / 8.0,
        policies.rates.sup_gbps * 1e9 / 8.0,
    ]
}

/// The policy of a flow: the first rule whose subnets match and, for a rule that names a class,
/// whose class is the flow's (a rule with a class does not match while the class is unknown),
/// else the default.
pub fn choose(policies: &Policies, pair: Pair, intra: Option<bool>) -> FlowPolicy {
    let matches = |subnet: &Option<String>, address: Ipv4Addr| {
        subnet.as_deref().map_or(true, |text| {
            Subnet::parse(text).is_ok_and(|s| s.contains(address))
        })
    };
    let rule = policies.rules.iter().find(|rule| {
        let class_ok = matches!(
            (rule.class.as_deref(), intra),
            (None, _) | (Some("intra"), Some(true)) | (Some("inter"), Some(false))
        );
        class_ok && matches(&rule.src, pair.src) && matches(&rule.dst, pair.dst)
    });
    let (kind, value) = rule.map_or((policies.default, None), |r| (r.policy, r.sup_bw));
    match kind {
        PolicyKind::Static => FlowPolicy::Static(value.unwrap_or(0)),
        PolicyKind::Capacity => FlowPolicy::Capacity,
        PolicyKind::Adaptive => FlowPolicy::Adaptive(Box::new(Adaptive::new(&policies.adaptive))),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
#[path = "state_tests.rs"]
mod tests;
