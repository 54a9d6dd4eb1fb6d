//! The rail rate model (`MPIB_LOOPBACK_RAILS`) on a fake clock: parsing, per-rail wire clocks,
//! the shared and mixing caps, schedules, and RC order. One test drives real WRs through the
//! world to show deliveries wait for the modelled time.

use proptest::prelude::*;

use super::rates::RateModel;
use crate::fabric::Rail;

const GB: u64 = 1_000_000_000;

/// NCCL's window over the model: slot `k` (both of its parts) is posted when slot `k - 8` has
/// completed, i.e. when both of its parts were delivered. Returns the bytes per second the
/// slots moved until the last one completed, `chunk` bytes a slot, SUP taking `share_sup`/1024.
fn saturate(model: &mut RateModel, share_sup: u64, chunk: u64, window_ns: u64) -> f64 {
    const WINDOW: usize = 8;
    let sup = chunk * share_sup / 1024;
    let parts = [(Rail::ScaleOut, chunk - sup), (Rail::ScaleUp, sup)];
    let mut completed: Vec<u64> = Vec::new();
    let mut moved = 0u64;
    loop {
        let post = match completed.len() {
            k if k < WINDOW => 0,
            k => completed[k - WINDOW],
        };
        if post >= window_ns {
            break;
        }
        let done = parts
            .iter()
            .filter(|(_, bytes)| *bytes > 0)
            .map(|(rail, bytes)| model.admit(*rail, *bytes, post))
            .max()
            .unwrap_or(post);
        completed.push(done);
        moved += chunk;
    }
    let last = completed.iter().copied().max().unwrap_or(1);
    moved as f64 * 1e9 / last as f64
}

#[test]
fn parses_rates_latencies_caps_and_phases() {
    let model = RateModel::parse(
        "sout=2GB/s, sup=32Gbit/s, latency=5us, sup.latency=2us, shared=5GB/s, mixed=1.5GB/s; \
         2s: sup=0.5GB/s; 2.5s: sup=off, shared=off",
    )
    .unwrap();
    let start = model.rates_at(0);
    assert_eq!(start.rate, [Some(2 * GB), Some(4 * GB)]);
    assert_eq!(start.latency_ns, [5_000, 2_000]);
    assert_eq!(
        (start.shared, start.mixed),
        (Some(5 * GB), Some(1_500_000_000))
    );
    let degraded = model.rates_at(2 * GB);
    assert_eq!(degraded.rate, [Some(2 * GB), Some(GB / 2)]);
    assert_eq!(
        degraded.latency_ns, start.latency_ns,
        "a phase changes only what it names"
    );
    let last = model.rates_at(3 * GB);
    assert_eq!(
        (last.rate[1], last.shared, last.mixed),
        (None, None, Some(1_500_000_000))
    );
    assert_eq!(model.initial_speed_mbps(0, Rail::ScaleOut), Some(16_000));
    assert!(RateModel::parse("").unwrap().rates_at(0) == Default::default());
    assert!(!RateModel::parse(" ").unwrap().active());
}

/// Every NIC is its own wire: two SOUT NICs move at once, each at its rate (`loopN=` over the
/// rail's), and a NIC shared by two pairs is one wire.
#[test]
fn each_nic_has_its_own_wire_and_rate() {
    let model = || RateModel::parse("sout=1GB/s,sup=2GB/s,loop2=4GB/s,loop5=off").unwrap();
    let mut rates = model();
    assert_eq!(
        rates.admit_on(0, Rail::ScaleOut, GB, 0),
        GB,
        "1 GB at 1 GB/s: 1 s"
    );
    assert_eq!(
        rates.admit_on(2, Rail::ScaleOut, GB, 0),
        GB / 4,
        "loop2's own 4 GB/s"
    );
    assert_eq!(
        rates.admit_on(4, Rail::ScaleOut, GB, 0),
        GB,
        "loop4: its own idle wire"
    );
    assert_eq!(
        rates.admit_on(5, Rail::ScaleUp, GB, 0),
        0,
        "loop5=off: unlimited"
    );
    assert_eq!(rates.admit_on(1, Rail::ScaleUp, GB, 0), GB / 2);
    assert_eq!(
        rates.admit_on(1, Rail::ScaleUp, GB, 0),
        GB,
        "one NIC, one wire: queued"
    );
    let speeds = model();
    assert_eq!(speeds.initial_speed_mbps(2, Rail::ScaleOut), Some(32_000));
    assert_eq!(speeds.initial_speed_mbps(3, Rail::ScaleUp), Some(16_000));
    assert_eq!(speeds.initial_speed_mbps(5, Rail::ScaleUp), None);
    assert!(RateModel::parse("loop16=1GB/s").is_err(), "no such NIC");
}

#[test]
fn bad_specs_name_the_variable_and_item() {
    for (spec, token) in [
        ("sout=2", "2"),
        ("sout=2GB", "2GB"),
        ("sup=-1GB/s", "-1GB/s"),
        ("sout=0GB/s", "0GB/s"),
        ("latency=5", "5"),
        ("speed=1GB/s", "speed=1GB/s"),
        ("sout", "sout"),
        ("1s:sout=1GB/s", "1s:sout=1GB/s"),
        ("sout=1GB/s;sup=1GB/s", "sup=1GB/s"),
        ("sout=1GB/s;2s:sup=1GB/s;1s:sup=2GB/s", "1s:sup=2GB/s"),
    ] {
        let err = RateModel::parse(spec).unwrap_err().to_string();
        assert!(err.contains("MPIB_LOOPBACK_RAILS"), "{spec}: {err}");
        assert!(err.contains(&format!("`{token}`")), "{spec}: {err}");
    }
}

#[test]
fn independent_rails_add_up_at_the_rate_proportional_split() {
    let mut model = RateModel::parse("sout=2GB/s,sup=4GB/s,latency=5us").unwrap();
    // SUP share 683/1024 = 2/3: both wires finish together.
    let rate = saturate(&mut model, 683, 4 << 20, GB);
    assert!((rate / (6.0 * GB as f64) - 1.0).abs() < 0.01, "{rate}");
    // An even split is held back by the slower rail: 2 x 2 GB/s.
    let mut model = RateModel::parse("sout=2GB/s,sup=4GB/s,latency=5us").unwrap();
    let rate = saturate(&mut model, 512, 4 << 20, GB);
    assert!(rate < 4.2 * GB as f64 && rate > 2.0 * GB as f64, "{rate}");
}

#[test]
fn the_shared_cap_bounds_both_rails_together() {
    let mut model = RateModel::parse("sout=2GB/s,sup=4GB/s,shared=3GB/s").unwrap();
    let rate = saturate(&mut model, 683, 4 << 20, GB);
    assert!((rate / (3.0 * GB as f64) - 1.0).abs() < 0.01, "{rate}");
}

#[test]
fn the_mixing_cap_applies_only_while_both_rails_carry_data() {
    let spec = "sout=2GB/s,sup=4GB/s,mixed=1.5GB/s";
    let mixed = saturate(&mut RateModel::parse(spec).unwrap(), 683, 4 << 20, GB);
    let sup_alone = saturate(&mut RateModel::parse(spec).unwrap(), 1024, 4 << 20, GB);
    assert!((mixed / (1.5 * GB as f64) - 1.0).abs() < 0.02, "{mixed}");
    assert!(
        (sup_alone / (4.0 * GB as f64) - 1.0).abs() < 0.01,
        "{sup_alone}"
    );
}

#[test]
fn a_phase_change_applies_to_wrs_posted_after_it() {
    let mut model = RateModel::parse("sup=1GB/s;1s:sup=0.5GB/s").unwrap();
    assert_eq!(model.admit(Rail::ScaleUp, GB / 10, 0), GB / 10);
    // Posted at 1 s (wire idle): 100 MB at 0.5 GB/s.
    assert_eq!(model.admit(Rail::ScaleUp, GB / 10, GB), GB + GB / 5);
}

#[test]
fn a_busy_wire_queues_and_latency_follows_the_wire() {
    let mut model = RateModel::parse("sout=1GB/s,latency=10us").unwrap();
    let first = model.admit(Rail::ScaleOut, 1_000_000, 0);
    let second = model.admit(Rail::ScaleOut, 1_000_000, 0);
    assert_eq!(first, 1_000_000 + 10_000);
    assert_eq!(second, 2_000_000 + 10_000);
    // The other rail is unlimited: only its latency.
    assert_eq!(model.admit(Rail::ScaleUp, 1_000_000, 0), 10_000);
}

proptest! {
    /// RC order: on one rail, deliveries never go backwards, whatever the sizes, post times,
    /// phases and caps.
    #[test]
    fn deliveries_on_a_rail_never_go_backwards(
        posts in proptest::collection::vec((0u64..2, 0u64..(8 << 20), 0u64..2_000_000), 1..200),
        mixed in prop::bool::ANY,
    ) {
        let spec = if mixed {
            "sout=2GB/s,sup=4GB/s,latency=3us,shared=5GB/s,mixed=1GB/s;1ms:sup=0.5GB/s,latency=1us"
        } else {
            "sout=1GB/s,sup.latency=7us;500us:sout=8GB/s"
        };
        let mut model = RateModel::parse(spec).unwrap();
        let mut now = 0;
        let mut last = [0u64; 2];
        for (rail, bytes, gap) in posts {
            now += gap;
            let target = if rail == 0 { Rail::ScaleOut } else { Rail::ScaleUp };
            let done = model.admit(target, bytes, now);
            prop_assert!(done >= now);
            prop_assert!(done >= last[rail as usize], "rail {rail}: {done} after {}", last[rail as usize]);
            last[rail as usize] = done;
        }
    }
}

#[test]
fn a_write_through_the_world_arrives_only_after_its_wire_time() {
    use super::tests::{pair, poll, post, serial_with_rates, write, Buf};
    use crate::fabric::{Access, CompletionStatus, Fabric};
    use std::time::{Duration, Instant};

    // 1 MB at 100 MB/s: 10 ms on the wire, plus 1 ms of latency.
    let (_s, fabric) = serial_with_rates("", "sout=100MB/s,latency=1ms");
    assert_eq!(
        fabric
            .open("loop0", Rail::ScaleOut)
            .unwrap()
            .info()
            .speed_mbps,
        800
    );
    let (mut tx, rx) = pair(&fabric, 16, 8);
    let (src, dst) = (Buf::new(1_000_000, 0x3c), Buf::new(1_000_000, 0));
    let (lk, rk) = (
        src.register(&*tx.dev, Access::LOCAL),
        dst.register(&*rx.dev, Access::DATA),
    );
    let posted = Instant::now();
    post(&mut *tx.qp, &[write(1, &src, lk, &dst, rk)]).unwrap();
    let mut done = poll(&mut *tx.cq, 1);
    let early = Instant::now();
    if early.duration_since(posted) < Duration::from_millis(10) {
        assert!(done.is_empty(), "delivered before its wire time");
        assert!(dst.bytes().iter().all(|&b| b == 0), "bytes landed early");
    }
    while done.is_empty() {
        assert!(
            posted.elapsed() < Duration::from_secs(10),
            "never delivered"
        );
        done = poll(&mut *tx.cq, 1);
    }
    assert!(posted.elapsed() >= Duration::from_millis(11));
    assert_eq!(done[0].status, CompletionStatus::Success);
    assert!(dst.bytes().iter().all(|&b| b == 0x3c));
}
