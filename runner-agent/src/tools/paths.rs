//! Confinement of file-tool paths to the workdir.
//!
//! A requested path is joined to the workdir and normalized lexically (`.` dropped, `..` popped),
//! so it must name something under the workdir before the file system is consulted at all; then
//! the existing part is canonicalized, so a symlink that leads out is refused too. The tools only
//! ever open the resolved path, never the caller's spelling. Errors are sentences for the model.

use std::io::ErrorKind;
use std::path::{Component, Path, PathBuf};

/// Resolves a path that must exist (read_file, list_dir). `workdir` is canonical.
pub(super) fn resolve_existing(workdir: &Path, requested: &str) -> Result<PathBuf, String> {
    let lexical = lexical(workdir, requested)?;
    let resolved = lexical.canonicalize().map_err(|err| match err.kind() {
        ErrorKind::NotFound => format!("{requested}: no such file or directory"),
        _ => format!("{requested}: {err}"),
    })?;
    inside(workdir, &resolved, requested)?;
    Ok(resolved)
}

/// Resolves a path to write (write_file): the file may be missing, and so may its parent
/// directories, which the caller then creates. An existing symlink is followed, and must stay
/// inside. `workdir` is canonical.
pub(super) fn resolve_for_write(workdir: &Path, requested: &str) -> Result<PathBuf, String> {
    let lexical = lexical(workdir, requested)?;
    if lexical == workdir {
        return Err(format!("{requested}: is the working directory itself"));
    }
    if lexical.symlink_metadata().is_ok() {
        let resolved = lexical.canonicalize().map_err(|err| match err.kind() {
            ErrorKind::NotFound => format!("{requested}: is a symlink to a missing file"),
            _ => format!("{requested}: {err}"),
        })?;
        inside(workdir, &resolved, requested)?;
        return Ok(resolved);
    }
    // The deepest existing ancestor decides where the new components land.
    let mut existing = lexical.as_path();
    let mut missing = Vec::new();
    while existing.symlink_metadata().is_err() {
        let (Some(parent), Some(name)) = (existing.parent(), existing.file_name()) else {
            return Err(format!("{requested}: no existing ancestor"));
        };
        missing.push(name.to_owned());
        existing = parent;
    }
    let base = existing.canonicalize().map_err(|err| format!("{requested}: {err}"))?;
    inside(workdir, &base, requested)?;
    Ok(missing.iter().rev().fold(base, |path, name| path.join(name)))
}

/// How a resolved path is shown back: relative to the workdir, `.` for the workdir itself.
pub(super) fn display(workdir: &Path, resolved: &Path) -> String {
    match resolved.strip_prefix(workdir) {
        Ok(relative) if relative.as_os_str().is_empty() => ".".to_owned(),
        Ok(relative) => relative.display().to_string(),
        Err(_) => resolved.display().to_string(),
    }
}

fn lexical(workdir: &Path, requested: &str) -> Result<PathBuf, String> {
    if requested.is_empty() {
        return Err("`path` must not be empty".to_owned());
    }
    if requested.contains('\0') {
        return Err("`path` must not contain NUL".to_owned());
    }
    let mut normal = PathBuf::new();
    for component in workdir.join(requested).components() {
        match component {
            Component::ParentDir => {
                normal.pop();
            }
            Component::CurDir => {}
            other => normal.push(other),
        }
    }
    inside(workdir, &normal, requested)?;
    Ok(normal)
}

fn inside(workdir: &Path, path: &Path, requested: &str) -> Result<(), String> {
    if path.starts_with(workdir) { Ok(()) } else { Err(format!("{requested}: escapes the working directory")) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_inside_the_workdir() {
        let root = tempfile::tempdir().unwrap();
        let workdir = root.path().join("work");
        std::fs::create_dir_all(workdir.join("sub")).unwrap();
        let workdir = workdir.canonicalize().unwrap();
        std::fs::write(workdir.join("sub/a.txt"), "a").unwrap();
        std::fs::write(root.path().join("secret"), "s").unwrap();
        std::os::unix::fs::symlink(root.path().join("secret"), workdir.join("out")).unwrap();
        std::os::unix::fs::symlink(root.path(), workdir.join("outdir")).unwrap();
        std::os::unix::fs::symlink(workdir.join("sub/a.txt"), workdir.join("in")).unwrap();

        assert_eq!(resolve_existing(&workdir, "sub/./a.txt").unwrap(), workdir.join("sub/a.txt"));
        assert_eq!(resolve_existing(&workdir, "sub/../sub/a.txt").unwrap(), workdir.join("sub/a.txt"));
        assert_eq!(resolve_existing(&workdir, "in").unwrap(), workdir.join("sub/a.txt"));
        assert_eq!(resolve_existing(&workdir, ".").unwrap(), workdir);
        let absolute = workdir.join("sub/a.txt");
        assert_eq!(resolve_existing(&workdir, absolute.to_str().unwrap()).unwrap(), absolute);

        for escape in ["../secret", "sub/../../secret", "/etc/passwd", "out", "outdir/secret"] {
            let err = resolve_existing(&workdir, escape).unwrap_err();
            assert!(err.contains("escapes the working directory"), "{escape}: {err}");
        }
        for escape in ["../new.txt", "out", "outdir/new.txt", "/tmp/new.txt"] {
            let err = resolve_for_write(&workdir, escape).unwrap_err();
            assert!(err.contains("escapes the working directory"), "{escape}: {err}");
        }
        assert_eq!(resolve_for_write(&workdir, "in").unwrap(), workdir.join("sub/a.txt"));
        assert_eq!(resolve_for_write(&workdir, "new/deep/b.txt").unwrap(), workdir.join("new/deep/b.txt"));
        assert!(resolve_for_write(&workdir, ".").is_err());
        assert!(resolve_existing(&workdir, "").is_err());
        assert!(resolve_existing(&workdir, "nope").unwrap_err().contains("no such file"));
        assert_eq!(display(&workdir, &workdir.join("sub/a.txt")), "sub/a.txt");
        assert_eq!(display(&workdir, &workdir), ".");
    }
}
