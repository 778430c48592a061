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

use engine::Run;
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
    for t in 0..seconds {
        for (s, limit) in run.series.iter().zip(&limits) {
            let x = s.seconds[t];
            writeln!(
                out,
                "{t},{},{},{},{},{limit},{:.6}",
                s.traffic.account, s.traffic.op, x.attempted, x.admitted, x.factor
            )?;
        }
    }
    Ok(())
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
