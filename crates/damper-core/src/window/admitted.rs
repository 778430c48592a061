//! [`AdmittedShare`]: a round's admitted rate, kept as its share of the
//! round's demand in two bytes.

/// The steps of a share: 1 is `u16::MAX`.
const WHOLE: u16 = u16::MAX;
/// One step, to multiply by rather than divide.
const STEP: f32 = 1.0 / WHOLE as f32;

/// A round's summed admitted rate as a share of its summed demand, in
/// 65 535ths. What is admitted is never more than what was attempted
/// (reports are validated so), so the share is in `[0, 1]`, and to a
/// 65 535th of the demand it is as exact as anything shown of it. Views
/// and metrics read the admitted rate, and of the policies only
/// `linear-ramp` (the feedback policy kept for comparison), whose factors
/// move by a few parts in 100 000 for it; the default policy never does.
/// Two bytes where an `f32` took four: with the demand's, a window's
/// rounds fit 32 bytes rather than 36, in each of a master's millions of
/// entries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct AdmittedShare(u16);

impl AdmittedShare {
    /// `admitted` of `demand` (both cost per second); 0 when there is no
    /// demand.
    pub(super) fn of(admitted: f32, demand: f32) -> AdmittedShare {
        if demand > 0.0 && admitted > 0.0 {
            // To the nearest step: `+ 0.5` and a truncating cast rather than
            // `round`, a call into libm on the baseline x86-64 target.
            AdmittedShare(((admitted / demand).min(1.0) * f32::from(WHOLE) + 0.5) as u16)
        } else {
            AdmittedShare(0)
        }
    }

    /// The admitted rate this share of `demand` stands for.
    pub(super) fn rate(self, demand: f32) -> f32 {
        demand * f32::from(self.0) * STEP
    }

    /// The share once a report of `added` demand, `admitted` of it, joined
    /// `demand` (this share's): `total` in all. A report that admitted all
    /// it attempted, to a round that did too (any account not suppressed),
    /// keeps the whole share with no arithmetic: a master ingests millions
    /// of them a second.
    pub(super) fn add(self, demand: f32, added: f64, admitted: f64, total: f32) -> AdmittedShare {
        let all_so_far = self.0 == WHOLE || demand == 0.0;
        if all_so_far && admitted >= added {
            return AdmittedShare(if total > 0.0 { WHOLE } else { 0 });
        }
        AdmittedShare::of(self.rate(demand) + admitted as f32, total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn no_demand_admits_nothing_and_all_of_it_admits_all() {
        assert_eq!(AdmittedShare::of(0.0, 0.0).rate(0.0), 0.0);
        assert_eq!(AdmittedShare::of(5.0, 0.0), AdmittedShare(0));
        assert_eq!(AdmittedShare::of(100.0, 100.0).rate(100.0), 100.0);
        let first = AdmittedShare::default().add(0.0, 40.0, 40.0, 40.0);
        assert_eq!(first, AdmittedShare(WHOLE));
        assert_eq!(first.add(40.0, 10.0, 10.0, 50.0).rate(50.0), 50.0);
        let half = first.add(40.0, 40.0, 0.0, 80.0).rate(80.0);
        assert!((half - 40.0).abs() <= 80.0 * STEP, "{half}");
        assert_eq!(
            AdmittedShare::default().add(0.0, 0.0, 0.0, 0.0).rate(0.0),
            0.0
        );
    }

    proptest! {
        /// Summed report by report, as a round's reports arrive, the
        /// share reads back within a 65 535th of the demand per report of
        /// what an exact sum gives, and never above the demand.
        #[test]
        fn summed_shares_stay_within_a_step_a_report(
            reports in proptest::collection::vec((1.0f64..1e6, 0.0f64..=1.0), 1..200),
        ) {
            let (mut demand, mut admitted, mut share) = (0.0f32, 0.0f64, AdmittedShare::default());
            for &(d, s) in &reports {
                let total = demand + d as f32;
                share = share.add(demand, d, d * s, total);
                demand = total;
                admitted += d * s;
            }
            let (read, demand) = (f64::from(share.rate(demand)), f64::from(demand));
            prop_assert!(read <= demand * (1.0 + 1e-6));
            prop_assert!((read - admitted).abs() <= demand * reports.len() as f64 / f64::from(WHOLE));
        }
    }
}
