//! Helpers shared by the end-to-end tests.

/// A file of the repository. The package directory is read at run time (cargo sets it for test
/// processes): the compile-time value goes stale when clones at other paths share one target
/// directory and cargo reuses their test binaries.
pub fn repo_file(rel: &str) -> std::path::PathBuf {
    let dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into());
    dir.join("..").join(rel)
}
