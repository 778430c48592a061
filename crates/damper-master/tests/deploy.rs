//! The deployment files in `docs/deploy/` stay in step with the binary:
//! every flag the Kubernetes manifest and the Dockerfile pass is one
//! `damper-master` accepts, and the limits in the manifest's ConfigMap are a
//! valid config. (No cluster or container engine runs here; this is what can
//! be checked without one.)

use std::path::PathBuf;
use std::process::Command;

fn deploy(file: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../docs/deploy")
        .join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Runs the binary with `args` plus `--check-config config`: clap refuses an
/// unknown flag or a bad value before the config is even read.
fn accepts(args: &[String], config: &str) {
    // Removed, with what the test wrote, when dropped.
    let scratch = tempfile::Builder::new()
        .prefix("damper-deploy-")
        .tempdir()
        .unwrap();
    let dir = scratch.path();
    let file = dir.join("master.toml");
    std::fs::write(&file, config).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_damper-master"))
        .args(args)
        .arg("--check-config")
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn the_kubernetes_manifest_passes_flags_and_limits_the_master_accepts() {
    let manifest = deploy("master.yaml");
    // The ConfigMap's master.toml: the block indented under `master.toml: |`.
    let mut lines = manifest
        .lines()
        .skip_while(|l| !l.contains("master.toml: |"))
        .skip(1);
    let indent = "    ";
    let config: String = lines
        .by_ref()
        .take_while(|l| l.is_empty() || l.starts_with(indent))
        .map(|l| format!("{}\n", l.strip_prefix(indent).unwrap_or("")))
        .collect();
    assert!(config.contains("[limits]"), "{config}");
    let args: Vec<String> = manifest
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- --"))
        .map(|flag| format!("--{flag}"))
        .collect();
    assert!(args.iter().any(|a| a.starts_with("--config=")), "{args:?}");
    accepts(&args, &config);
}

#[test]
fn the_dockerfile_starts_the_master_with_flags_it_accepts() {
    let dockerfile = deploy("Dockerfile");
    // The master's stage is the last (the default target).
    let cmd = dockerfile
        .lines()
        .filter_map(|l| l.strip_prefix("CMD "))
        .next_back()
        .expect("a CMD line");
    let args: Vec<String> = serde_json::from_str(cmd).expect("CMD in exec form");
    accepts(&args, "[limits]\nmessages = 1000\n");
}
