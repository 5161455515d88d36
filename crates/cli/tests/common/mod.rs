//! Helpers shared by the CLI integration tests: the real binary and the shipped dataset.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

/// The diffrl binary under test.
pub fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_diffrl"))
}

/// Runs the binary; Ok(stdout) on success, Err(stderr) on failure.
pub fn diffrl(args: &[&str]) -> Result<String, String> {
    let out = bin().args(args).output().expect("the diffrl binary runs");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The shipped expert dataset, found at run time (test binaries may be reused by another
/// checkout sharing the target directory).
pub fn shipped() -> String {
    let dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into());
    dir.join("../../assets/pusht_expert_200")
        .display()
        .to_string()
}
