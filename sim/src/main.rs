//! `damper-sim`: run scenarios in virtual time and plot them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use damper_core::config::EstimatorKind;
use damper_sim::scenario::Scenario;
use damper_sim::{engine, plot, summary, write_run};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Replays a scenario's traffic through Damper's agent and master state
/// machines in virtual time, with network delay, loss and failures, and
/// writes summary.json, timeseries.csv, plot.svg and plot.png.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Args {
    #[command(subcommand)]
    command: Command,
    /// Threads to run on (1 to 1024; by default one per core). The output
    /// is the same whatever the number: only the agents' wake-ups at one
    /// instant are shared out, and only in large runs.
    #[arg(long, global = true, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1024))]
    threads: Option<u16>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Runs one scenario.
    Run {
        /// The scenario file (TOML; see docs/simulation.md).
        scenario: PathBuf,
        /// Directory for the outputs (created if missing).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// Overrides the scenario's policy: demand or linear-ramp.
        #[arg(long, value_name = "NAME", value_parser = ["demand", "linear-ramp"])]
        policy: Option<String>,
        #[command(flatten)]
        overrides: Overrides,
    },
    /// Runs the scenario under every policy and draws them in one figure.
    Compare {
        /// The scenario file.
        scenario: PathBuf,
        /// Directory for the outputs: one subdirectory per policy, and the
        /// combined summary.json, plot.svg and plot.png.
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        #[command(flatten)]
        overrides: Overrides,
    },
}

/// Settings of the scenario the command line overrides.
#[derive(clap::Args, Debug)]
struct Overrides {
    /// Overrides the scenario's estimator: latest-round or ably-mma.
    #[arg(long, value_name = "NAME", value_parser = ["latest-round", "ably-mma"])]
    estimator: Option<String>,
    /// Overrides the scenario's `cluster.fast_onset`: true or false.
    #[arg(long, value_name = "BOOL")]
    fast_onset: Option<bool>,
    /// Overrides the scenario's `cluster.push`: true or false.
    #[arg(long, value_name = "BOOL")]
    push: Option<bool>,
    /// Overrides the scenario's `cluster.low_noise`: true or false.
    #[arg(long, value_name = "BOOL")]
    low_noise: Option<bool>,
    /// Overrides the scenario's `cluster.pace`: true or false.
    #[arg(long, value_name = "BOOL")]
    pace: Option<bool>,
    /// Overrides the scenario's `cluster.freeze_sparse`: true or false.
    #[arg(long, value_name = "BOOL")]
    freeze_sparse: Option<bool>,
    /// Overrides the scenario's `cluster.young_peeks`: true or false.
    #[arg(long, value_name = "BOOL")]
    young_peeks: Option<bool>,
    /// Overrides the scenario's `cluster.sparse_hints`: true or false.
    #[arg(long, value_name = "BOOL")]
    sparse_hints: Option<bool>,
    /// Overrides the scenario's `policy.confidence_sigmas` (0 to 20; 0:
    /// suppress on any excess).
    #[arg(long, value_name = "SIGMAS")]
    confidence_sigmas: Option<f64>,
}

/// mimalloc, as the master binary: the simulator's rounds allocate and
/// free each rollup's names and buffers, millions an hour.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    match sim() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("damper-sim: error: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

fn load(path: &Path, overrides: &Overrides) -> anyhow::Result<Scenario> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut scenario = Scenario::from_toml(&text).with_context(|| format!("{}", path.display()))?;
    if let Some(on) = overrides.fast_onset {
        scenario = scenario.with_fast_onset(on);
    }
    if let Some(on) = overrides.push {
        scenario = scenario.with_push(on);
    }
    if let Some(on) = overrides.low_noise {
        scenario = scenario.with_low_noise(on);
    }
    if let Some(on) = overrides.pace {
        scenario = scenario.with_pace(on);
    }
    if let Some(on) = overrides.freeze_sparse {
        scenario = scenario.with_freeze_sparse(on);
    }
    if let Some(on) = overrides.young_peeks {
        scenario = scenario.with_young_peeks(on);
    }
    if let Some(on) = overrides.sparse_hints {
        scenario = scenario.with_sparse_hints(on);
    }
    if let Some(sigmas) = overrides.confidence_sigmas {
        scenario = scenario
            .with_confidence_sigmas(sigmas)
            .context("--confidence-sigmas")?;
    }
    Ok(match overrides.estimator.as_deref() {
        Some("ably-mma") => scenario.with_estimator(EstimatorKind::AblyMma),
        Some(_) => scenario.with_estimator(EstimatorKind::LatestRound),
        None => scenario,
    })
}

/// Runs with a progress bar on stderr, shown only for runs that take more
/// than a couple of seconds and only on a terminal.
#[allow(clippy::disallowed_types)] // Wall time decides when to show the bar.
fn run_with_progress(scenario: Scenario) -> engine::Run {
    let bar =
        ProgressBar::with_draw_target(Some(scenario.duration_s), ProgressDrawTarget::hidden());
    bar.set_style(
        ProgressStyle::with_template("{prefix} [{bar:40}] {pos}/{len} simulated s ({eta})")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_prefix(format!("{} ({})", scenario.name, scenario.policy_name()));
    let started = std::time::Instant::now();
    let mut shown = false;
    let run = engine::run(scenario, |s| {
        if !shown && started.elapsed() > Duration::from_secs(2) {
            bar.set_draw_target(ProgressDrawTarget::stderr());
            shown = true;
        }
        bar.set_position(s);
    });
    bar.finish_and_clear();
    run
}

fn sim() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(threads) = args.threads {
        rayon::ThreadPoolBuilder::new()
            .num_threads(usize::from(threads))
            .build_global()
            .context("--threads")?;
    }
    match args.command {
        Command::Run {
            scenario,
            out,
            policy,
            overrides,
        } => {
            let mut s = load(&scenario, &overrides)?;
            if let Some(policy) = policy {
                s = s.with_policy(&policy).context("--policy")?;
            }
            let run = run_with_progress(s);
            let figures = summary::summarize(&run);
            write_run(&out, &run, &figures)
                .map_err(|e| anyhow::anyhow!("writing {}: {e}", out.display()))?;
            println!("{}", serde_json::to_string_pretty(&figures)?);
        }
        Command::Compare {
            scenario,
            out,
            overrides,
        } => {
            let base = load(&scenario, &overrides)?;
            let mut runs = Vec::new();
            let mut all = Vec::new();
            for policy in ["demand", "linear-ramp"] {
                let s = base.with_policy(policy).context(policy)?;
                let run = run_with_progress(s);
                let figures = summary::summarize(&run);
                write_run(&out.join(policy), &run, &figures)
                    .map_err(|e| anyhow::anyhow!("writing {}: {e}", out.display()))?;
                all.push(figures);
                runs.push(run);
            }
            let estimator = base.master.window.estimator.name();
            let title = format!(
                "{} — demand vs linear-ramp, estimator {estimator}",
                base.name
            );
            for name in ["plot.svg", "plot.png"] {
                plot::draw(&out.join(name), &title, &runs)
                    .map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
            }
            let json = serde_json::to_string_pretty(&all)?;
            std::fs::write(out.join("summary.json"), json.clone() + "\n")?;
            println!("{json}");
        }
    }
    Ok(())
}
