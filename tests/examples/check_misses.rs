//! What one `check` costs in instructions and cache misses, Damper's agent
//! state machine beside governor's keyed limiter over the same shuffled
//! keys: counts that do not move with the machine's load, and that a
//! machine without hardware counters (this project's development VMs) can
//! still give, run under callgrind's cache simulation.
//!
//! Each run sets up one limiter with every key known (Damper's factors
//! applied as a master's reply would, as in the `check_*_1m` benchmarks:
//! 0 on the calm op, 1 on the flooded one; governor with a quota that
//! never runs out, or one spent), visits every key once to warm it, then
//! makes `CHECKS` checks in a shuffled order inside [`measure`], the only
//! function callgrind is told to count (`--toggle-collect`).
//!
//! Run (`docs/bench/check_misses.sh` runs every case and prints the table):
//!
//! ```sh
//! cargo build --release -p damper-tests --example check_misses
//! valgrind --tool=callgrind --cache-sim=yes --LL=33554432,16,64 \
//!     --toggle-collect='check_misses::measure' --callgrind-out-file=/dev/null \
//!     target/release/examples/check_misses damper admit 100000 1000000
//! ```
//!
//! Arguments: `damper`, `governor` or `keys` (no limiter: the loop
//! reads each key's bytes, the caller's share of the misses); `admit` or
//! `reject`; the number of keys; the number of checks measured.

#![allow(clippy::disallowed_types)]

use std::hint::black_box;

// The benchmarks' keys, order, ops and governor set-up.
#[path = "../benches/common/mod.rs"]
mod common;

use damper_core::agent::AgentState;
use governor::DefaultKeyedRateLimiter;
use rand::SeedableRng;
use rand::rngs::SmallRng;

/// The limiter measured.
enum Limiter {
    Damper(Box<AgentState>),
    Governor(DefaultKeyedRateLimiter<String>),
    /// No limiter: the loop reads each key's bytes and nothing else, the
    /// share of the misses that is the caller's (its `Vec` of keys and
    /// their bytes), not the limiter's.
    Keys,
}

/// Which limiter a run measures, as its first argument names it.
#[derive(Clone, Copy, PartialEq)]
enum Which {
    Damper,
    Governor,
    Keys,
}

impl Which {
    fn name(self) -> &'static str {
        match self {
            Which::Damper => "damper",
            Which::Governor => "governor",
            Which::Keys => "keys",
        }
    }
}

/// One run's arguments.
struct Args {
    limiter: Which,
    admit: bool,
    keys: usize,
    checks: usize,
}

fn main() {
    let args = match parse(std::env::args().skip(1).collect()) {
        Ok(args) => args,
        Err(message) => {
            eprintln!("check_misses: {message}");
            eprintln!("usage: check_misses damper|governor|keys admit|reject KEYS CHECKS");
            std::process::exit(2);
        }
    };
    let keys = common::keys_n("account", args.keys);
    let order = common::order_n(2, args.keys);
    let limiter = match args.limiter {
        Which::Damper => Limiter::Damper(Box::new(common::state_machine(&keys))),
        Which::Governor => Limiter::Governor(common::governor(&keys, args.admit)),
        Which::Keys => Limiter::Keys,
    };
    let case = Case {
        limiter,
        keys: &keys,
        admit: args.admit,
    };
    // Every key once, as the measured loop will: the first touch of each
    // (a page fault, the allocator's first writes) is not the check's.
    let warm: Vec<usize> = (0..args.keys).collect();
    black_box(case.run(&warm, warm.len()));
    let measured = measure(&case, &order, args.checks);
    println!(
        "{} {} keys={} checks={} admitted={}",
        args.limiter.name(),
        if args.admit { "admit" } else { "reject" },
        args.keys,
        args.checks,
        measured
    );
    // The path measured must be the one asked for: every check admitted,
    // or none (the loop with no limiter admits every key).
    let expected = if args.admit { args.checks } else { 0 };
    if measured != expected {
        eprintln!(
            "check_misses: {measured} of {} checks admitted, not {expected}",
            args.checks
        );
        std::process::exit(1);
    }
}

/// The arguments, each checked; the message names the one that is wrong.
fn parse(args: Vec<String>) -> Result<Args, String> {
    let [limiter, path, keys, checks] = args.as_slice() else {
        return Err(format!("4 arguments expected, {} given", args.len()));
    };
    let limiter = [Which::Damper, Which::Governor, Which::Keys]
        .into_iter()
        .find(|which| which.name() == limiter)
        .ok_or_else(|| format!("LIMITER: {limiter:?} is not damper, governor or keys"))?;
    let admit = match path.as_str() {
        "admit" => true,
        "reject" => false,
        other => return Err(format!("PATH: {other:?} is neither admit nor reject")),
    };
    let count = |name: &str, value: &str| match value.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("{name}: {value:?} is not a whole number above 0")),
    };
    if limiter == Which::Keys && !admit {
        return Err("PATH: the loop with no limiter (`keys`) refuses nothing: give admit".into());
    }
    Ok(Args {
        limiter,
        admit,
        keys: count("KEYS", keys)?,
        checks: count("CHECKS", checks)?,
    })
}

/// One limiter over its keys, on one path.
struct Case<'k> {
    limiter: Limiter,
    keys: &'k [String],
    admit: bool,
}

/// The checks callgrind counts (`--toggle-collect` names this function):
/// `checks` of them, visiting `order` round and round. Returns how many
/// were admitted.
#[inline(never)]
fn measure(case: &Case<'_>, order: &[usize], checks: usize) -> usize {
    case.run(order, checks)
}

impl Case<'_> {
    /// `checks` checks on the keys of `order`, round and round; how many
    /// were admitted.
    fn run(&self, order: &[usize], checks: usize) -> usize {
        let (op, cost) = common::op_and_cost(self.admit);
        let now = common::STATE_NOW;
        let mut rng = SmallRng::seed_from_u64(7);
        // One loop per limiter, the choice made once.
        match &self.limiter {
            Limiter::Damper(state) => self.each(order, checks, |key| {
                state.check(now, key, op, cost, &mut rng).is_admit()
            }),
            Limiter::Governor(gov) => self.each(order, checks, |key| gov.check_key(key).is_ok()),
            Limiter::Keys => self.each(order, checks, |key| {
                black_box(key.bytes().fold(0u8, |a, b| a ^ b)) != 0xff
            }),
        }
    }

    /// How many of `checks` calls of `check`, on the keys of `order`
    /// round and round, said yes.
    #[inline(always)]
    fn each(
        &self,
        order: &[usize],
        checks: usize,
        mut check: impl FnMut(&String) -> bool,
    ) -> usize {
        let mut next = Visit::new(order);
        let mut admitted = 0;
        for _ in 0..checks {
            admitted += usize::from(check(&self.keys[next.key()]));
        }
        admitted
    }
}

/// Where the loop is in `order`, round and round: a compare rather than a
/// division per check, the same for every limiter.
struct Visit<'o> {
    order: &'o [usize],
    at: usize,
}

impl<'o> Visit<'o> {
    fn new(order: &'o [usize]) -> Visit<'o> {
        Visit { order, at: 0 }
    }

    #[inline(always)]
    fn key(&mut self) -> usize {
        let key = self.order[self.at];
        self.at += 1;
        if self.at == self.order.len() {
            self.at = 0;
        }
        key
    }
}
