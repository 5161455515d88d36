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

/// A SHA-256 over every file under `dir`: relative paths (sorted, `/`-separated), sizes and
/// bytes. Two folders with the same files hash the same wherever they are; a retrained model
/// or a changed dataset hashes differently. Temp files of [`write_atomic`] in flight (names
/// starting with `.tmp`) are skipped. Hex-encoded.
pub fn content_hash(dir: &Path) -> std::io::Result<String> {
    use sha2::{Digest, Sha256};
    let mut files = Vec::new();
    collect_files(dir, String::new(), &mut files)?;
    files.sort();
    let mut h = Sha256::new();
    for rel in files {
        let bytes = std::fs::read(dir.join(&rel))?;
        h.update((rel.len() as u64).to_le_bytes());
        h.update(rel.as_bytes());
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(&bytes);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

fn collect_files(dir: &Path, prefix: String, out: &mut Vec<String>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir.join(&prefix))? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(".tmp") {
            continue;
        }
        let rel = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        if entry.file_type()?.is_dir() {
            collect_files(dir, rel, out)?;
        } else {
            out.push(rel);
        }
    }
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

    #[test]
    fn content_hash_follows_the_files_not_the_folder() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        for d in [a.path(), b.path()] {
            std::fs::create_dir_all(d.join("sub")).unwrap();
            std::fs::write(d.join("model.json"), b"{}").unwrap();
            std::fs::write(d.join("sub/weights.bin"), [1u8, 2, 3]).unwrap();
        }
        let ha = content_hash(a.path()).unwrap();
        assert_eq!(ha.len(), 64);
        assert_eq!(ha, content_hash(b.path()).unwrap());
        // A temp file in flight is not content.
        std::fs::write(b.path().join(".tmpXYZ"), b"partial").unwrap();
        assert_eq!(ha, content_hash(b.path()).unwrap());
        std::fs::write(b.path().join("sub/weights.bin"), [1u8, 2, 4]).unwrap();
        assert_ne!(ha, content_hash(b.path()).unwrap());
        // Moving bytes between files changes the hash too.
        std::fs::write(b.path().join("sub/weights.bin"), [1u8, 2, 3]).unwrap();
        std::fs::rename(b.path().join("model.json"), b.path().join("other.json")).unwrap();
        assert_ne!(ha, content_hash(b.path()).unwrap());
        assert!(content_hash(&a.path().join("missing")).is_err());
    }
}
