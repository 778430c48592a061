//! The sidecar's deployment files stay in step with the binary: the
//! Dockerfile's `agentd` stage and the Kubernetes example pass flags and a
//! config `damper-agentd` accepts. (No cluster or container engine runs
//! here; this is what can be checked without one.)

use std::path::PathBuf;
use std::process::Command;

fn deploy(file: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../docs/deploy")
        .join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The Kubernetes example's agentd.toml (the block under `agentd.toml: |`).
fn sidecar_config() -> String {
    deploy("sidecar.yaml")
        .lines()
        .skip_while(|l| !l.contains("agentd.toml: |"))
        .skip(1)
        .take_while(|l| l.is_empty() || l.starts_with("    "))
        .map(|l| format!("{}\n", l.strip_prefix("    ").unwrap_or("")))
        .collect()
}

/// Runs `damper-agentd args --check-config` with `--config` pointing at
/// `config` written to a file.
fn accepts(args: &[String], config: &str) {
    // Removed, with what the test wrote, when dropped.
    let scratch = tempfile::Builder::new()
        .prefix("damper-agentd-deploy-")
        .tempdir()
        .unwrap();
    let dir = scratch.path();
    let file = dir.join("agentd.toml");
    std::fs::write(&file, config).unwrap();
    let args: Vec<String> = args
        .iter()
        .map(|a| {
            a.replace("/etc/damper/agentd.toml", &file.display().to_string())
                .replace("$(POD_NAME)", "pubsub-node-0")
        })
        .collect();
    let output = Command::new(env!("CARGO_BIN_EXE_damper-agentd"))
        .args(&args)
        .arg("--check-config")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn the_kubernetes_sidecar_example_passes_flags_and_a_config_it_accepts() {
    let config = sidecar_config();
    assert!(
        config.contains("[masters]") && config.contains("unix ="),
        "{config}"
    );
    let args: Vec<String> = deploy("sidecar.yaml")
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- --"))
        .map(|flag| format!("--{flag}"))
        .collect();
    assert!(args.iter().any(|a| a.starts_with("--config=")), "{args:?}");
    accepts(&args, &config);
}

#[test]
fn the_dockerfile_agentd_stage_starts_it_with_flags_it_accepts() {
    let dockerfile = deploy("Dockerfile");
    let stage: String = dockerfile
        .lines()
        .skip_while(|l| !l.contains("AS agentd"))
        .take_while(|l| !l.starts_with("# The master"))
        .collect::<Vec<_>>()
        .join("\n");
    let cmd = stage
        .lines()
        .find_map(|l| l.strip_prefix("CMD "))
        .expect("a CMD line in the agentd stage");
    let args: Vec<String> = cmd
        .trim_matches(['[', ']'])
        .split(", ")
        .map(|a| a.trim_matches('"').to_owned())
        .collect();
    accepts(&args, &sidecar_config());
}
