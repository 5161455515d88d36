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

/// Reads the child's stderr line by line until `line` matches (each line is an event from the
/// process, no polling), then returns the reader so the rest can be drained. Panics with what
/// was read if the stream ends first.
pub fn wait_for_line(
    stderr: std::process::ChildStderr,
    pred: impl Fn(&str) -> bool,
) -> std::io::Lines<std::io::BufReader<std::process::ChildStderr>> {
    use std::io::BufRead;
    let mut lines = std::io::BufReader::new(stderr).lines();
    let mut seen = Vec::new();
    for line in lines.by_ref() {
        let line = line.expect("reading the child's stderr");
        if pred(&line) {
            return lines;
        }
        seen.push(line);
    }
    panic!(
        "the process ended before the awaited line:\n{}",
        seen.join("\n")
    );
}
