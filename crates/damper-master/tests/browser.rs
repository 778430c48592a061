//! The accounts page in a real headless browser: a `damper-master` process
//! with a flooding agent, and `tests/browser/accounts_page.mjs` driving
//! Debian's Chromium (through playwright-core) to find the suppressed
//! account on the page, filter and sort. `tests/browser/setup.sh` installs
//! both; `.ci/run` calls it before the tests.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::MasterProcess;
use damper_agent::Agent;
use damper_load::Paced;

#[test]
fn the_accounts_page_shows_the_suppressed_account() {
    let browser_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/browser");
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        std::path::Path::new(&chromium).exists()
            && browser_dir.join("node_modules/playwright-core").exists(),
        "the browser test needs Chromium and playwright-core: run tests/browser/setup.sh (.ci/run does)"
    );

    // Removed, with what the test wrote, when dropped.
    let scratch = tempfile::Builder::new()
        .prefix("damper-browser-")
        .tempdir()
        .unwrap();
    let dir = scratch.path();
    let config = dir.join("master.toml");
    std::fs::write(
        &config,
        "[window]\nrollup_interval_ms = 500\nsub_interval_ms = 1500\ngrace_ms = 200\n\
         [limits]\nmessages = 1000\n",
    )
    .unwrap();
    let master = MasterProcess::start("127.0.0.1:0", &["--config".as_ref(), config.as_os_str()]);

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let _guard = runtime.enter();
    let agent = Arc::new(
        Agent::builder()
            .masters([master.address.clone()])
            .rollup_interval(Duration::from_millis(500))
            .start()
            .unwrap(),
    );
    // Per second: flood-co 5000 on messages (5x its limit) and 500 on the
    // unlimited presence; calm-co 200 and acme-ltd 400 on messages.
    let traffic = Paced::start(Duration::from_millis(10), {
        let agent = agent.clone();
        move || {
            for _ in 0..10 {
                agent.check("flood-co", "messages", 5);
            }
            agent.check("flood-co", "presence", 5);
            agent.check("calm-co", "messages", 2);
            agent.check("acme-ltd", "messages", 4);
        }
    });
    // Let the master see every pair once before the page loads.
    for _ in 0..600 {
        if master.get("/v1/accounts").1.matches("\"account\"").count() >= 4 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }

    let url = format!("http://{}/", master.http.as_deref().unwrap());
    let output = Command::new("node")
        .current_dir(&browser_dir)
        .args(["accounts_page.mjs", &url, "flood-co", "calm-co"])
        .env("CHROMIUM", &chromium)
        .output()
        .expect("node runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("{stdout}{stderr}");

    traffic.stop();
    drop(agent);
    assert!(master.terminate());
    assert!(output.status.success(), "the page test failed: {stderr}");
    assert!(stdout.contains("flood-co | messages"), "{stdout}");
}
