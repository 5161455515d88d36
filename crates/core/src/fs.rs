//! Atomic file writes: a reader never sees a half-written file, a crash leaves the old one.

use std::io::Write;
use std::path::Path;
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Writers hold it shared while they replace a file or folder; [`stop_writes`] takes it
/// exclusively, so an interrupted process exits between writes, never inside one.
static WRITES: RwLock<()> = RwLock::new(());

/// Held while a file or folder is being replaced (the atomic writers here take it; so does any
/// code that swaps folders by renames). Do not take it twice on one thread.
pub fn write_guard() -> RwLockReadGuard<'static, ()> {
    WRITES.read().unwrap_or_else(PoisonError::into_inner)
}

/// Waits for the writes in progress to finish and holds new ones back while the guard lives:
/// what a Ctrl-C handler takes before it exits the process.
pub fn stop_writes() -> RwLockWriteGuard<'static, ()> {
    WRITES.write().unwrap_or_else(PoisonError::into_inner)
}

/// Writes `bytes` to `path` atomically: a temp file in the same folder, fsync, then rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_atomic_with(path, |f| f.write_all(bytes))
}

/// Like [`write_atomic`], with the content produced by a writer callback.
pub fn write_atomic_with<E: From<std::io::Error>>(
    path: &Path,
    write: impl FnOnce(&mut std::fs::File) -> Result<(), E>,
) -> Result<(), E> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(dir)?;
    let _writing = write_guard();
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    // Temp files are private (0600); the result gets the replaced file's mode, else 0644.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path).map_or(0o644, |m| m.permissions().mode() & 0o7777);
        tmp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(mode))?;
    }
    write(tmp.as_file_mut())?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| E::from(e.error))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_writer_leaves_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.txt");
        write_atomic(&p, b"old").unwrap();
        let r: Result<(), std::io::Error> = write_atomic_with(&p, |f| {
            f.write_all(b"half")?;
            Err(std::io::Error::other("boom"))
        });
        assert!(r.is_err());
        assert_eq!(std::fs::read(&p).unwrap(), b"old");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o644, "readable by others like any written file");
        }
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "temp file removed"
        );
    }
}
