//! The `capacity` policy: the share that would finish both parts of a transfer together if each
//! rail ran at its link rate. A transfer of `B` bytes split `s` to SUP takes `B(1-s)/sout` on
//! SOUT and `Bs/sup` on SUP; equal times give `s = sup / (sout + sup)`.

use super::{FULL, SOUT, SUP};

/// The share for link rates `rate` (any unit), `None` when either is unknown (0).
pub fn share(rate: [f64; 2]) -> Option<u32> {
    let (sout, sup) = (rate[SOUT], rate[SUP]);
    if !(sout > 0.0 && sup > 0.0) {
        return None;
    }
    Some(((sup / (sout + sup)) * f64::from(FULL)).round() as u32)
}

#[cfg(test)]
mod tests {
    use super::share;

    #[test]
    fn equal_finish_share() {
        assert_eq!(share([2.0, 4.0]), Some(683));
        assert_eq!(share([100.0, 100.0]), Some(512));
        assert_eq!(share([0.0, 4.0]), None);
        assert_eq!(share([f64::NAN, 4.0]), None);
    }
}
