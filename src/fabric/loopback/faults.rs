//! Parsing of the deterministic fault knobs (`MPIB_LOOPBACK_FAULTS`).
//!
//! The knobs exist so that tests can provoke, on demand and reproducibly, the situations real
//! hardware produces only by accident: completions of different rails arriving out of order,
//! slow rails, transport failures, and receivers that stop refilling their SRQ.

use super::fabric_error;
use crate::fabric::{FabricError, Rail};

/// The name of the setting the knobs come from; every parse error names it so that a user who
/// mistyped a knob knows which variable to fix.
pub(crate) const FAULTS_VAR: &str = "MPIB_LOOPBACK_FAULTS";

/// The parsed fault knobs. All per-rail arrays are indexed by [`Rail::index`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Faults {
    /// `reorder`: progress runs SUP QPs before SOUT QPs, each rail in reverse creation order.
    pub(crate) reorder: bool,
    /// `delay=RAIL:N`: progress passes a WR posted on the rail waits before it may execute.
    pub(crate) delay: [u64; 2],
    /// `fail=RAIL:N`: the 1-based index of the WR posted on the rail that fails.
    pub(crate) fail: [Option<u64>; 2],
    /// `starve=RAIL:N`: how many receives each SRQ of the rail accepts over its lifetime.
    pub(crate) starve: [Option<u64>; 2],
    /// `portdown=RAIL:N`: posting the N-th WR on the rail raises IBV_EVENT_PORT_ERR on its
    /// device (traffic itself continues: it tests that async events are read and acted on).
    pub(crate) port_down: [Option<u64>; 2],
    /// `cut=RAIL:N`: posting the N-th WR on the rail cuts its wire: from then every WR on any
    /// QP of the rail, that one included, fails with `RetryExceeded` and lands nothing, as
    /// behind a pulled cable (no event: a port knob is `portdown`).
    pub(crate) cut: [Option<u64>; 2],
    /// `heal=RAIL:N`: N WRs (posted on any rail) after the rail's `cut` or `portdown` fired,
    /// its wire is mended and its device raises IBV_EVENT_PORT_ACTIVE: a rail that comes back.
    pub(crate) heal: [Option<u64>; 2],
    /// `arp=RAIL:N`: the rail's peer addresses resolve after N polls of a resolution; a QP
    /// connected before that waits a second inside `connect`, as the kernel does in
    /// `ibv_modify_qp(RTR)` on a RoCE port with no valid neighbour entry.
    pub(crate) unresolved: [u64; 2],
    /// `max_qp=RAIL:N`, `max_cq=RAIL:N`, `max_srq=RAIL:N`, `max_srq_wr=RAIL:N`, `max_mr=RAIL:N`:
    /// what the rail's NICs report as their limits instead of a ConnectX-5's, so that a test
    /// reaches them with a few connections.
    pub(crate) limits: [[Option<u32>; 5]; 2],
}

impl Faults {
    /// Parses a comma-separated knob list. Empty items (an empty string, a trailing comma) are
    /// ignored so that `MPIB_LOOPBACK_FAULTS=` means "no faults". A knob given twice keeps the
    /// last value, like a later flag overriding an earlier one on a command line.
    pub(crate) fn parse(text: &str) -> Result<Faults, FabricError> {
        let mut faults = Faults::default();
        for token in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            faults
                .apply(token)
                .map_err(|why| parse_error(text, token, why))?;
        }
        Ok(faults)
    }

    /// Applies one knob; the error is the reason only (the caller adds the context).
    fn apply(&mut self, token: &str) -> Result<(), &'static str> {
        if token == "reorder" {
            self.reorder = true;
            return Ok(());
        }
        let (name, value) = token.split_once('=').ok_or("unknown knob")?;
        let (rail, count) = parse_rail_count(value)?;
        let slot = rail.index();
        match name.trim() {
            "delay" => self.delay[slot] = count,
            // The N-th WR is 1-based: `fail=sout:0` would silently never fire, which is
            // certainly not what the user meant.
            "fail" if count == 0 => return Err("fail counts WRs from 1"),
            "fail" => self.fail[slot] = Some(count),
            "starve" => self.starve[slot] = Some(count),
            "portdown" if count == 0 => return Err("portdown counts WRs from 1"),
            "portdown" => self.port_down[slot] = Some(count),
            "cut" if count == 0 => return Err("cut counts WRs from 1"),
            "cut" => self.cut[slot] = Some(count),
            "heal" if count == 0 => return Err("heal counts WRs from 1"),
            "heal" => self.heal[slot] = Some(count),
            "arp" => self.unresolved[slot] = count,
            "max_qp" | "max_cq" | "max_srq" | "max_srq_wr" | "max_mr" => {
                let kind = ["max_qp", "max_cq", "max_srq", "max_srq_wr", "max_mr"]
                    .iter()
                    .position(|k| *k == name.trim())
                    .unwrap_or(0);
                let count = u32::try_from(count).map_err(|_| "a limit fits 32 bits")?;
                self.limits[slot][kind] = Some(count);
            }
            _ => return Err("unknown knob"),
        }
        Ok(())
    }
}

/// Parses `RAIL:N`.
fn parse_rail_count(value: &str) -> Result<(Rail, u64), &'static str> {
    let (rail, count) = value.split_once(':').ok_or("expected RAIL:N")?;
    let rail = match rail.trim() {
        "sout" => Rail::ScaleOut,
        "sup" => Rail::ScaleUp,
        _ => return Err("RAIL must be `sout` or `sup`"),
    };
    let count = count
        .trim()
        .parse::<u64>()
        .map_err(|_| "N must be a non-negative integer")?;
    Ok((rail, count))
}

/// The error for a bad knob: names the variable, the whole value and the offending token.
fn parse_error(text: &str, token: &str, why: &str) -> FabricError {
    let detail = format!(
        "{FAULTS_VAR}=`{text}`: bad knob `{token}` ({why}); expected a comma-separated list \
         of `reorder`, `delay=RAIL:N`, `fail=RAIL:N`, `starve=RAIL:N`, `portdown=RAIL:N`, `cut=RAIL:N`, `heal=RAIL:N`, `arp=RAIL:N`, \
         `max_qp=RAIL:N`, `max_cq=RAIL:N`, `max_srq=RAIL:N`, `max_srq_wr=RAIL:N`, `max_mr=RAIL:N` with RAIL \
         `sout` or `sup`"
    );
    fabric_error(
        "LoopbackFabric::new",
        "loopback",
        None,
        libc::EINVAL,
        detail,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_means_no_faults() {
        assert_eq!(Faults::parse("").unwrap(), Faults::default());
        assert_eq!(Faults::parse(" , ,").unwrap(), Faults::default());
    }

    #[test]
    fn all_knobs_parse() {
        let f = Faults::parse(
            "reorder, delay=sup:3,fail=sout:2,starve=sup:0,portdown=sout:4,arp=sup:9",
        )
        .unwrap();
        assert_eq!(f.unresolved, [0, 9]);
        assert_eq!(f.port_down, [Some(4), None]);
        assert!(f.reorder);
        assert_eq!(f.delay, [0, 3]);
        assert_eq!(f.fail, [Some(2), None]);
        assert_eq!(f.starve, [None, Some(0)]);
    }

    #[test]
    fn bad_knobs_name_the_variable_and_token() {
        for bad in [
            "bogus",
            "delay=sout",
            "delay=x:1",
            "fail=sup:-1",
            "fail=sout:0",
            "zap=sup:1",
        ] {
            let err = Faults::parse(&format!("reorder,{bad}")).unwrap_err();
            let text = err.to_string();
            assert!(text.contains("MPIB_LOOPBACK_FAULTS"), "{text}");
            assert!(text.contains(&format!("`{bad}`")), "{text}");
            assert_eq!(err.errno, libc::EINVAL);
        }
    }
}
