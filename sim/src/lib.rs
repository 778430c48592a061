//! `damper-sim`: replays traffic through Damper's agent and master state
//! machines (`damper-core`, the code the services run: each simulated agent
//! is an `AgentState` and the very `AgentRound` the agent library drives)
//! in virtual time, with network delay, loss and failures, and reports and
//! plots what happens.
//!
//! # Layout
//! - [`scenario`]: scenario files, validated.
//! - [`engine`]: the discrete-event simulation; its [`engine::Masters`]
//!   are the simulated ones ([`engine::SimMasters`]) or, in the test
//!   suite, the product's master service.
//! - [`summary`]: the figures of a run.
//! - [`plot`]: SVG and PNG figures.
//! - `src/main.rs`: the `damper-sim` binary (`run`, `compare`).
//!
//! # Example
//! ```
//! use damper_sim::{engine, scenario::Scenario, summary};
//! let scenario = Scenario::from_toml(r#"
//!     name = "tiny deluge"
//!     duration_s = 40
//!     [cluster]
//!     agents = 4
//!     masters = 1
//!     [limits]
//!     messages = 1000
//!     [[traffic]]
//!     account = "acme"
//!     op = "messages"
//!     profile = [ { at_s = 0, rate = 10000 } ]
//! "#).unwrap();
//! let run = engine::run(scenario, |_| {});
//! let figures = summary::summarize(&run);
//! let ratio = figures.accounts[0].steady_admitted_ratio.unwrap();
//! assert!((ratio - 1.0).abs() < 0.05, "{ratio}");
//! ```
#![forbid(unsafe_code)]

pub mod engine;
pub mod plot;
pub mod scenario;
pub mod summary;

use std::io::{BufWriter, Write};
use std::path::Path;

use engine::{Run, Second, Series};
use summary::Summary;

/// `timeseries.csv`: one row per (account, op) and simulated second; row
/// `t` covers `[t, t + 1)`. Costs are per second; `limit` is empty when
/// there is none; `factor` is the master's factor in force at the end of the
/// second, averaged over the item's agents.
pub fn timeseries_csv(run: &Run) -> String {
    let mut out = Vec::new();
    write_timeseries(&mut out, run).expect("writing to memory does not fail");
    String::from_utf8(out).expect("written from strings")
}

/// [`timeseries_csv`] written to `out` row by row: an hour of a thousand
/// accounts is 3.6 million rows, 157 MB, which the simulator need not hold.
pub fn write_timeseries(out: &mut impl Write, run: &Run) -> std::io::Result<()> {
    out.write_all(b"t,account,op,attempted,admitted,limit,factor\n")?;
    let seconds = run.series.first().map_or(0, |s| s.seconds.len());
    let limits: Vec<String> = run
        .series
        .iter()
        .map(|s| s.limit.map_or(String::new(), |l| format!("{l}")))
        .collect();
    // Rows go second by second, each through every series: read a block
    // of seconds of each series at once (one series' seconds sit
    // together), not one second of a thousand series' each row.
    const BLOCK: usize = 16;
    let mut block: Vec<Second> = Vec::with_capacity(BLOCK * run.series.len());
    let mut row = Vec::with_capacity(128);
    for first in (0..seconds).step_by(BLOCK) {
        let end = (first + BLOCK).min(seconds);
        block.clear();
        for s in &run.series {
            block.extend_from_slice(&s.seconds[first..end]);
        }
        let width = end - first;
        for t in first..end {
            for (i, (s, limit)) in run.series.iter().zip(&limits).enumerate() {
                let x = block[i * width + t - first];
                row.clear();
                write_row(&mut row, t, s, limit, &x);
                out.write_all(&row)?;
            }
        }
    }
    Ok(())
}

/// One row of `timeseries.csv`, as `{t},{account},{op},{attempted},
/// {admitted},{limit},{factor:.6}` formats it, into `row`: the integers by
/// `itoa` and a zero factor (most rows of a large run) as its fixed text,
/// the same bytes without the formatting machinery per field (a tenth of
/// the hour's run before).
fn write_row(row: &mut Vec<u8>, t: usize, s: &Series, limit: &str, x: &Second) {
    let mut digits = itoa::Buffer::new();
    row.extend_from_slice(digits.format(t).as_bytes());
    row.push(b',');
    row.extend_from_slice(s.traffic.account.as_bytes());
    row.push(b',');
    row.extend_from_slice(s.traffic.op.as_bytes());
    row.push(b',');
    row.extend_from_slice(digits.format(x.attempted).as_bytes());
    row.push(b',');
    row.extend_from_slice(digits.format(x.admitted).as_bytes());
    row.push(b',');
    row.extend_from_slice(limit.as_bytes());
    row.push(b',');
    if x.factor.to_bits() == 0 {
        row.extend_from_slice(b"0.000000");
    } else {
        write!(row, "{:.6}", x.factor).expect("writing to memory does not fail");
    }
    row.push(b'\n');
}

/// Writes `summary.json`, `timeseries.csv`, `plot.svg` and `plot.png` of
/// one run into `dir`.
pub fn write_run(dir: &Path, run: &Run, summary: &Summary) -> Result<(), plot::PlotError> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(
        dir.join("summary.json"),
        serde_json::to_string_pretty(summary)? + "\n",
    )?;
    let mut csv = BufWriter::new(std::fs::File::create(dir.join("timeseries.csv"))?);
    write_timeseries(&mut csv, run)?;
    csv.flush()?;
    let title = format!("{} — policy {}", run.scenario, run.policy);
    let runs = std::slice::from_ref(run);
    plot::draw(&dir.join("plot.svg"), &title, runs)?;
    plot::draw(&dir.join("plot.png"), &title, runs)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Control;
    use crate::scenario::{Arrivals, Traffic};

    /// A row is written as the format string it replaced would write it,
    /// the factor's rounding and a negative zero included.
    #[test]
    fn a_row_is_the_bytes_the_format_string_gave() {
        let series = Series {
            traffic: Traffic {
                account: "acme-1".into(),
                op: "messages".into(),
                agents: vec![0],
                cost: 1,
                profile: Vec::new(),
                arrivals: Arrivals::Uniform,
            },
            limit: Some(2_500.5),
            seconds: Vec::new(),
            factor_changes: Vec::new(),
        };
        let factors = [
            0.0,
            -0.0,
            0.5,
            1.0,
            0.999_999_5,
            0.000_000_5,
            1e-12,
            0.123_456_789,
        ];
        for (k, factor) in factors.into_iter().enumerate() {
            for (attempted, admitted) in [(0, 0), (7, 3), (u64::MAX, 1 << 40)] {
                let x = Second {
                    attempted,
                    admitted,
                    factor,
                };
                let t = 3_599 * k;
                let mut row = Vec::new();
                write_row(&mut row, t, &series, "2500.5", &x);
                assert_eq!(
                    String::from_utf8(row).unwrap(),
                    format!("{t},acme-1,messages,{attempted},{admitted},2500.5,{factor:.6}\n")
                );
            }
        }
    }

    /// Rows come second by second through every series, whatever the
    /// blocks the writer reads the series in: each row holds its own
    /// series' own second, across block edges and a last short block.
    #[test]
    fn every_row_holds_its_series_second() {
        let seconds = 37;
        let series = (0..3u64)
            .map(|i| Series {
                traffic: Traffic {
                    account: format!("a{i}"),
                    op: "m".into(),
                    agents: vec![0],
                    cost: 1,
                    profile: Vec::new(),
                    arrivals: Arrivals::Uniform,
                },
                limit: (i != 1).then_some(100.0),
                seconds: (0..seconds)
                    .map(|t| Second {
                        attempted: 1_000 * i + t,
                        admitted: t,
                        factor: 0.5,
                    })
                    .collect(),
                factor_changes: Vec::new(),
            })
            .collect();
        let run = Run {
            scenario: "s".into(),
            policy: "p".into(),
            estimator: "e".into(),
            series,
            rollups: (0, 0),
            dropped_cost: 0,
            control: Control::default(),
        };
        let csv = timeseries_csv(&run);
        let rows: Vec<&str> = csv.lines().skip(1).collect();
        assert_eq!(rows.len(), 3 * seconds as usize);
        for t in 0..seconds {
            for i in 0..3 {
                let limit = if i == 1 { "" } else { "100" };
                assert_eq!(
                    rows[(3 * t + i) as usize],
                    format!("{t},a{i},m,{},{t},{limit},0.500000", 1_000 * i + t)
                );
            }
        }
    }
}
