//! A flow's busy time per rail: each instant once, however many of its connections, in however
//! many processes, had a part in flight then.

use std::collections::BTreeMap;
use std::net::SocketAddrV4;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use mpib_probes::{
    ConnectionInfo, ConnectionProbe, Direction, Mode, PathClass, ProbesFile, RailInfo, WriterInfo,
};

use super::*;

const SECOND: u64 = 1_000_000_000;

struct Directory(PathBuf);

impl Directory {
    fn new(name: &str) -> Directory {
        let dir = std::env::temp_dir().join(format!("mpib-agent-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Directory(dir)
    }
}

impl Drop for Directory {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A probes file as another process of the node would write it (its own start time).
fn process_file(dir: &Path, process: u64) -> ProbesFile {
    let rails = ["sout0", "sup0"]
        .map(|device| RailInfo {
            device: device.into(),
            port: 1,
            speed_mbps: 100_000,
        })
        .to_vec();
    let mut writer = WriterInfo::for_this_process(rails);
    writer.start_ns += process;
    ProbesFile::create(dir, &writer).unwrap()
}

/// A measurer of `dir` that has read every connection there once (their baselines).
fn baselined(dir: &Path) -> Measurer {
    let mut measurer = Measurer::new(dir, &dir.join("no-sysfs"));
    measurer.measure(SECOND, &BTreeMap::new());
    measurer
}

fn connection_info(port: u16) -> ConnectionInfo {
    ConnectionInfo {
        peer: SocketAddrV4::new([10, 0, 0, 2].into(), port),
        direction: Direction::Send,
        path_class: PathClass::IntraIsland,
        mode: Mode::Advanced,
        hint_slot: 0,
        device: 0,
    }
}

fn send_connection(file: &ProbesFile, port: u16) -> ConnectionProbe<'_> {
    file.claim_connection(&connection_info(port)).unwrap()
}

/// Four processes, one connection each, on one flow. SUP is the bottleneck: all four always
/// have a part on it. SOUT parts finish early and the processes' idle gaps interleave: each
/// connection is busy on SOUT half the time, and the rail is busy with the flow seven eighths
/// of it. Summed, SOUT's busy time would be 2 s and SUP's 4 s (SUP looking half as fast as it
/// is next to SOUT); sampled, each instant counts once.
#[test]
fn a_rail_busy_in_several_processes_at_once_counts_each_instant_once() {
    let dir = Directory::new("measure-processes");
    let files: Vec<ProbesFile> = (0..4).map(|p| process_file(&dir.0, p)).collect();
    let connections: Vec<_> = files
        .iter()
        .enumerate()
        .map(|(p, file)| send_connection(file, 5000 + p as u16))
        .collect();
    let mut measurer = baselined(&dir.0);
    let users = BTreeMap::new();
    // 400 samples over the second; in sample i, connection c has a part on SOUT when
    // (i + 50 c) mod 400 < 200: each half the time, their union samples 0..200 and 250..400.
    let sout_busy = |i: u64, c: u64| ((i + 50 * c) % 400) < 200;
    for i in 0..400 {
        for (c, connection) in connections.iter().enumerate() {
            connection.set_rail_in_flight(0, u32::from(sout_busy(i, c as u64)));
            connection.set_rail_in_flight(1, 2);
        }
        measurer.sample();
    }
    for connection in &connections {
        connection.add_rail_done(0, 100_000_000, SECOND / 2);
        connection.add_rail_done(1, 250_000_000, SECOND);
    }
    let (flows, _) = measurer.measure(SECOND, &users);
    let sample = flows[&0].sample;
    assert_eq!(flows[&0].connections, 4);
    assert_eq!(
        sample.busy_ns,
        [SECOND * 350 / 400, SECOND],
        "each instant counted once"
    );
    let rate = |rail| sample.rate(rail).unwrap();
    assert_eq!(rate(1), 1e9, "SUP: 1 GB over the whole second");
    assert!((rate(0) - 0.4e9 / 0.875).abs() < 1.0, "SOUT: {}", rate(0));
}

/// A flow with no samples (a daemon that did not sample, or a file older than 2.2) keeps the
/// connections' summed busy time.
#[test]
fn without_samples_the_connections_busy_times_are_summed() {
    let dir = Directory::new("measure-summed");
    let file = process_file(&dir.0, 0);
    let connections: Vec<_> = (0..2).map(|c| send_connection(&file, 6000 + c)).collect();
    let mut measurer = baselined(&dir.0);
    let users = BTreeMap::new();
    for connection in &connections {
        connection.add_rail_done(0, 1_000, SECOND / 4);
        connection.add_rail_done(1, 1_000, SECOND / 2);
    }
    let (flows, _) = measurer.measure(SECOND, &users);
    assert_eq!(flows[&0].sample.busy_ns, [SECOND / 2, SECOND]);
}

/// Connections of one process busy together (8 communicators posting at the same moments):
/// the flow's busy time is the time any of them was, on both rails.
#[test]
fn connections_of_one_process_busy_together_count_once() {
    let dir = Directory::new("measure-together");
    let file = process_file(&dir.0, 0);
    let connections: Vec<_> = (0..8).map(|c| send_connection(&file, 7000 + c)).collect();
    let mut measurer = baselined(&dir.0);
    let users = BTreeMap::new();
    for i in 0..100 {
        for connection in &connections {
            connection.set_rail_in_flight(0, u32::from(i < 30));
            connection.set_rail_in_flight(1, u32::from(i < 60));
        }
        measurer.sample();
    }
    let (flows, _) = measurer.measure(SECOND, &users);
    assert_eq!(
        flows[&0].sample.busy_ns,
        [SECOND * 30 / 100, SECOND * 60 / 100]
    );
}

/// Two fused devices of one process share their SUP NIC: the two flows (one per device, each
/// its own SOUT NIC) split the SUP NIC's speed, so `capacity` gives each the share that fills
/// the NIC once (512 here), not twice (683). A third flow on device 0 to another peer shares
/// device 0's two NICs alike.
#[test]
fn a_sup_nic_shared_by_two_devices_is_one_capacity() {
    let dir = Directory::new("measure-shared-sup");
    let nic = |device: &str, speed_mbps| RailInfo {
        device: device.into(),
        port: 1,
        speed_mbps,
    };
    let mut writer = WriterInfo::for_this_process(vec![
        nic("sout0", 8_000),
        nic("sout1", 8_000),
        nic("sup", 16_000),
    ]);
    writer.devices = vec![
        mpib_probes::DeviceEntry {
            name: "sout0+sup".into(),
            nics: [0, 2],
        },
        mpib_probes::DeviceEntry {
            name: "sout1+sup".into(),
            nics: [1, 2],
        },
    ];
    let file = ProbesFile::create(&dir.0, &writer).unwrap();
    let claim = |device: u8, slot: u32, port: u16| {
        file.claim_connection(&ConnectionInfo {
            hint_slot: slot,
            device,
            ..connection_info(port)
        })
        .unwrap()
    };
    let _flows = [claim(0, 0, 7000), claim(1, 1, 7001)];
    let mut measurer = baselined(&dir.0);
    let (flows, _) = measurer.measure(SECOND, &BTreeMap::new());
    let gigabyte = 1e9;
    assert_eq!(
        flows[&0].sample.link_rate,
        [gigabyte, gigabyte],
        "SOUT 1 GB/s, half of SUP"
    );
    assert_eq!(flows[&1].sample.link_rate, [gigabyte, gigabyte]);
    assert_eq!(
        crate::policy::capacity::share(flows[&0].sample.link_rate),
        Some(512)
    );
    assert_eq!(
        flows[&0].sharers,
        [1, 2],
        "what a configured [rates] value is divided by"
    );
    let _third = claim(0, 2, 7002);
    let (flows, _) = measurer.measure(SECOND, &BTreeMap::new());
    assert_eq!(
        flows[&0].sample.link_rate,
        [gigabyte / 2.0, gigabyte * 2.0 / 3.0]
    );
    assert_eq!(flows[&1].sample.link_rate, [gigabyte, gigabyte * 2.0 / 3.0]);
}

/// A file is read only after the checks the collector makes: one its group may write, or one
/// whose name claims another pid than its header, is refused until it changes; a link is not
/// even listed.
#[test]
fn only_files_that_pass_the_trust_checks_are_read() {
    use std::os::unix::fs::PermissionsExt;

    let dir = Directory::new("measure-trust");
    let good = process_file(&dir.0, 0);
    let group_writable = process_file(&dir.0, 1);
    let writable_path = group_writable.path().unwrap().to_path_buf();
    let mode = |bits| std::fs::Permissions::from_mode(bits);
    std::fs::set_permissions(&writable_path, mode(0o620)).unwrap();
    let link = dir.0.join(format!("mpib-{}-9.probes", std::process::id()));
    std::os::unix::fs::symlink(good.path().unwrap(), &link).unwrap();
    let renamed = dir.0.join("mpib-1-9.probes");
    std::fs::copy(good.path().unwrap(), &renamed).unwrap();
    let mut measurer = Measurer::new(&dir.0, &dir.0.join("no-sysfs"));
    measurer.measure(SECOND, &BTreeMap::new());
    assert_eq!(measurer.files, 1);
    let refused: Vec<&PathBuf> = measurer.refused.keys().collect();
    assert_eq!(refused, [&renamed, &writable_path]);
    // Their slots are not known: no slot is reclaimed while they are there.
    assert_eq!(measurer.unreadable, 2);
    // One WARN now, the other counted for the next one.
    assert_eq!(measurer.refusals_unlogged, 1);
    // Made writable by its owner only: read from the next interval on.
    std::fs::set_permissions(&writable_path, mode(0o600)).unwrap();
    measurer.measure(SECOND, &BTreeMap::new());
    assert_eq!((measurer.files, measurer.refused.len()), (2, 1));
    assert_eq!(measurer.unreadable, 1);
    // A refused leftover of a dead job, untouched for longer than a writer's heartbeat allows,
    // keeps no slot: refused, not counted.
    let leftover = dir.0.join("mpib-999999999-9.probes");
    std::fs::write(&leftover, vec![b'x'; 8192]).unwrap(); // bad magic: corrupt
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(60);
    std::fs::File::options()
        .write(true)
        .open(&leftover)
        .unwrap()
        .set_modified(old)
        .unwrap();
    measurer.measure(SECOND, &BTreeMap::new());
    assert_eq!((measurer.refused.len(), measurer.unreadable), (2, 1));
    drop((good, group_writable));
}

/// A file renamed over a mapped one is the new file: the old mapping is dropped and the new
/// file read.
#[test]
fn a_file_renamed_over_a_mapped_one_is_read_afresh() {
    let dir = Directory::new("measure-renamed");
    let first = process_file(&dir.0, 0);
    let path = first.path().unwrap().to_path_buf();
    let mut measurer = Measurer::new(&dir.0, &dir.0.join("no-sysfs"));
    measurer.measure(SECOND, &BTreeMap::new());
    let mapped = |m: &Measurer| m.readers.get(&path).map(|(_, _, id)| id.ino);
    let before = mapped(&measurer).unwrap();
    let copy = dir.0.join("copy");
    std::fs::copy(&path, &copy).unwrap();
    std::fs::rename(&copy, &path).unwrap();
    measurer.measure(SECOND, &BTreeMap::new());
    let after = mapped(&measurer).unwrap();
    assert_ne!(before, after, "still the old mapping");
    assert_eq!(after, std::fs::metadata(&path).unwrap().ino());
    drop(first);
}
