//! Policies: how an (account, op)'s rates and limit become a suppression
//! factor, the probability that an agent rejects each operation.

use crate::config::PolicyKind;
use crate::limits::Rate;
use crate::window::Rates;

impl PolicyKind {
    /// The suppression factor, in `[0, 1]`, for `rates` against `limit`.
    ///
    /// ```
    /// # use damper_core::{config::PolicyKind, limits::Rate, window::Rates};
    /// let limit = Rate::per_second(1000.0).unwrap();
    /// let deluge = Rates { demand: 4000.0, admitted: 1000.0 };
    /// // Admit a quarter of the demand: 4000 × (1 − 0.75) = 1000.
    /// assert_eq!(PolicyKind::Demand.factor(limit, deluge), 0.75);
    /// // Under the limit: exactly zero, never a little suppression.
    /// let calm = Rates { demand: 999.0, admitted: 999.0 };
    /// assert_eq!(PolicyKind::Demand.factor(limit, calm), 0.0);
    /// ```
    pub fn factor(&self, limit: Rate, rates: Rates) -> f64 {
        let limit = limit.get();
        match *self {
            PolicyKind::Demand => {
                if rates.demand > limit {
                    (1.0 - limit / rates.demand).clamp(0.0, 1.0)
                } else {
                    0.0
                }
            }
            PolicyKind::LinearRamp { ramp } => {
                // Ably's first prototype: from the admitted (post-suppression)
                // rate, 0 at the limit rising linearly to 1 at ramp × limit.
                if rates.admitted > limit {
                    ((rates.admitted - limit) / ((ramp - 1.0) * limit)).clamp(0.0, 1.0)
                } else {
                    0.0
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn limit() -> Rate {
        Rate::per_second(1000.0).unwrap()
    }

    #[test]
    fn demand_policy_lands_admitted_demand_at_the_limit() {
        for demand in [1_001.0, 2_000.0, 10_000.0, 1e9] {
            let f = PolicyKind::Demand.factor(
                limit(),
                Rates {
                    demand,
                    admitted: 0.0,
                },
            );
            assert!((demand * (1.0 - f) - 1000.0).abs() < 1e-6, "{demand}: {f}");
        }
        assert_eq!(
            PolicyKind::Demand.factor(
                limit(),
                Rates {
                    demand: 1000.0,
                    admitted: 0.0
                }
            ),
            0.0
        );
    }

    #[test]
    fn linear_ramp_follows_the_admitted_rate_not_the_demand() {
        let p = PolicyKind::LinearRamp { ramp: 3.0 };
        let f = |admitted: f64| {
            p.factor(
                limit(),
                Rates {
                    demand: 1e9,
                    admitted,
                },
            )
        };
        assert_eq!(f(1000.0), 0.0);
        assert_eq!(f(2000.0), 0.5);
        assert_eq!(f(3000.0), 1.0);
        assert_eq!(f(30000.0), 1.0);
        // A deluge that is fully suppressed reads as zero admitted: the
        // ramp lets everything through again. That is the oscillation.
        assert_eq!(f(0.0), 0.0);
    }

    proptest! {
        #[test]
        fn factors_are_probabilities_and_zero_under_the_limit(
            demand in 0.0f64..1e12, admitted_share in 0.0f64..=1.0, ramp in 1.001f64..100.0,
        ) {
            let rates = Rates { demand, admitted: demand * admitted_share };
            for p in [PolicyKind::Demand, PolicyKind::LinearRamp { ramp }] {
                let f = p.factor(limit(), rates);
                prop_assert!((0.0..=1.0).contains(&f));
                if demand <= 1000.0 {
                    prop_assert_eq!(f, 0.0);
                }
            }
        }
    }
}
