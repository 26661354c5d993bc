//! `apply_patch {patch, expected_sha256?}`: a unified diff over several files inside the workdir,
//! all of it or none of it.
//!
//! The patch is parsed with `diffy` (plain unified diffs, or `git diff` output when it has
//! `diff --git` headers). `--- a/x` / `+++ b/x` change `x` (the `a/` and `b/` prefixes are
//! dropped when present), `--- /dev/null` creates a file and `+++ /dev/null` deletes one. Renames,
//! copies and binary patches are refused.
//!
//! In three steps, so that nothing changes unless everything can (the recovery manifest of `docs/runner-tools.md`, "apply_patch"):
//! 1. **Check**: every file is resolved inside the workdir and read (UTF-8, at most
//!    [`EDIT_CAP_BYTES`]), compared with its declared base (`expected_sha256`: a digest, or `null`
//!    for "must not exist"), and every new content is computed in memory. Any problem with any
//!    file or hunk refuses the whole patch, names each problem, and touches nothing.
//! 2. **Stage**: each new content goes to a temp file beside its target, synced.
//! 3. **Commit**: the temp files are renamed over their targets (a deleted file is first renamed
//!    aside), then the set-aside files are removed. If a rename fails, the files already changed
//!    are put back (from the contents read in step 1). If putting one back fails too, the answer
//!    says exactly which files carry the patch (`structured_content.applied`) and which do not
//!    (`.not_applied`).

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use diffy::patch_set::{FileOperation, ParseOptions, PatchKind, PatchSet};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use tracing::warn;

use super::ToolOutcome;
use super::args::required_str;
use super::blocking::Cancel;
use super::edit::EDIT_CAP_BYTES;
use super::files::{ABANDONED, read_whole, refuse_irregular, replace_atomically, sync_parent, write_temp};
use super::paths::{display, resolve_existing, resolve_for_write};

/// A patch changes at most this many files.
pub(super) const MAX_PATCH_FILES: usize = 256;
/// The old and new contents of all files of a patch, held in memory together, in bytes (64 MiB).
pub(super) const MAX_PATCH_MEMORY_BYTES: u64 = 64 * 1024 * 1024;

/// What a patch does to one file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Change {
    Modify,
    Create,
    Delete,
}

impl Change {
    fn word(self) -> &'static str {
        match self {
            Change::Modify => "modified",
            Change::Create => "created",
            Change::Delete => "deleted",
        }
    }
}

/// One file's checked change: its base and its new content, both in memory.
#[derive(Debug)]
struct Planned {
    shown: String,
    path: PathBuf,
    change: Change,
    /// The content read in the check (`None` when created).
    base: Option<String>,
    /// The content to write (`None` when deleted).
    new: Option<String>,
    hunks: usize,
}

/// `apply_patch`: see the module's page.
pub(super) fn apply_patch(workdir: &Path, input: &Map<String, Value>, cancel: &Cancel) -> ToolOutcome {
    let patch = match required_str(input, "patch") {
        Ok(patch) => patch,
        Err(message) => return ToolOutcome::error(message),
    };
    let expected = match expected_bases(workdir, input.get("expected_sha256")) {
        Ok(expected) => expected,
        Err(message) => return ToolOutcome::error(message),
    };
    let planned = match check(workdir, patch, expected, cancel) {
        Ok(planned) => planned,
        Err(problems) => {
            let content = format!(
                "the patch was not applied, and no file was changed:\n{}",
                problems.iter().map(|problem| format!("- {problem}\n")).collect::<String>()
            );
            return ToolOutcome::Completed {
                content,
                structured_content: json!({ "applied": [], "not_applied": [], "problems": problems }),
                is_error: true,
            };
        }
    };
    if cancel.abandoned() {
        return ToolOutcome::error(format!("the patch was not applied: {ABANDONED}"));
    }
    render(&planned, commit(&planned, &mut RealDisk))
}

/// The `expected_sha256` object as resolved paths: `Some(hex)` a digest to match, `None` "must
/// not exist".
fn expected_bases(workdir: &Path, value: Option<&Value>) -> Result<HashMap<PathBuf, Option<String>>, String> {
    let mut expected = HashMap::new();
    let entries = match value {
        None | Some(Value::Null) => return Ok(expected),
        Some(Value::Object(entries)) => entries,
        Some(_) => return Err("`expected_sha256` must be an object of path -> hex digest or null".to_owned()),
    };
    for (requested, digest) in entries {
        let digest = match digest {
            Value::String(hex) => Some(hex.to_ascii_lowercase()),
            Value::Null => None,
            _ => return Err(format!("`expected_sha256.{requested}` must be a hex digest or null")),
        };
        expected.insert(resolve_for_write(workdir, requested)?, digest);
    }
    Ok(expected)
}

/// Step 1: every file's new content, or every problem found (as sentences naming file and hunk).
fn check(
    workdir: &Path,
    patch: &str,
    mut expected: HashMap<PathBuf, Option<String>>,
    cancel: &Cancel,
) -> Result<Vec<Planned>, Vec<String>> {
    let git = patch.lines().any(|line| line.starts_with("diff --git "));
    let options = if git { ParseOptions::gitdiff() } else { ParseOptions::unidiff() };
    let mut file_patches = Vec::new();
    for parsed in PatchSet::parse(patch, options) {
        match parsed {
            Ok(file_patch) => file_patches.push(file_patch),
            Err(err) => return Err(vec![format!("the patch does not parse: {err}")]),
        }
        if file_patches.len() > MAX_PATCH_FILES {
            return Err(vec![format!("the patch changes more than {MAX_PATCH_FILES} files; split it")]);
        }
    }
    let mut problems = Vec::new();
    let mut planned: Vec<Planned> = Vec::new();
    let mut memory = 0u64;
    for file_patch in &file_patches {
        if cancel.abandoned() {
            return Err(vec![ABANDONED.to_owned()]);
        }
        let (change, requested) = match file_patch.operation() {
            FileOperation::Modify { original, modified } => {
                let (original, modified) = (strip(original, "a/"), strip(modified, "b/"));
                if original != modified {
                    problems.push(format!(
                        "{original} -> {modified}: renames are not supported; delete the old file and create the new one"
                    ));
                    continue;
                }
                (Change::Modify, modified)
            }
            FileOperation::Create(path) => (Change::Create, strip(path, "b/")),
            FileOperation::Delete(path) => (Change::Delete, strip(path, "a/")),
            FileOperation::Rename { from, to } | FileOperation::Copy { from, to } => {
                problems.push(format!("{from} -> {to}: renames and copies are not supported"));
                continue;
            }
        };
        let PatchKind::Text(text_patch) = file_patch.patch() else {
            problems.push(format!("{requested}: binary patches are not supported"));
            continue;
        };
        let resolved = match change {
            Change::Create => resolve_for_write(workdir, requested),
            Change::Modify | Change::Delete => resolve_existing(workdir, requested),
        };
        let path = match resolved {
            Ok(path) => path,
            Err(message) => {
                problems.push(message);
                continue;
            }
        };
        let shown = display(workdir, &path);
        if planned.iter().any(|earlier| earlier.path == path) {
            problems.push(format!("{shown}: appears twice in the patch; give each file one section"));
            continue;
        }
        let declared = expected.remove(&path);
        let base = match read_base(&path, &shown, change, cancel) {
            Ok(base) => base,
            Err(message) => {
                problems.push(message);
                continue;
            }
        };
        if let Some(declared) = declared
            && let Err(message) = check_declared(&shown, base.as_deref(), declared.as_deref())
        {
            problems.push(message);
            continue;
        }
        let hunks = text_patch.hunks().len();
        let new = match diffy::apply(base.as_deref().unwrap_or(""), text_patch) {
            Ok(new) => new,
            Err(err) => {
                problems.push(hunk_problem(&shown, &err, text_patch));
                continue;
            }
        };
        let new = match change {
            Change::Delete if !new.is_empty() => {
                problems.push(format!(
                    "{shown}: the patch deletes it, but its hunks do not remove all of its content ({} bytes would remain)",
                    new.len()
                ));
                continue;
            }
            Change::Delete => None,
            Change::Modify | Change::Create => Some(new),
        };
        memory += base.as_ref().map_or(0, |text| text.len() as u64) + new.as_ref().map_or(0, |text| text.len() as u64);
        if new.as_ref().is_some_and(|text| text.len() as u64 > EDIT_CAP_BYTES) {
            problems.push(format!("{shown}: the patched file would be over the bound of {EDIT_CAP_BYTES} bytes"));
            continue;
        }
        if memory > MAX_PATCH_MEMORY_BYTES {
            return Err(vec![format!(
                "the files of the patch hold more than {MAX_PATCH_MEMORY_BYTES} bytes (old and new content together); \
                 split it"
            )]);
        }
        planned.push(Planned { shown, path, change, base, new, hunks });
    }
    for path in expected.keys() {
        problems.push(format!("expected_sha256 names {}, which the patch does not change", display(workdir, path)));
    }
    if problems.is_empty() { Ok(planned) } else { Err(problems) }
}

/// `path` without its `a/` or `b/` prefix, when it has it.
fn strip<'a>(path: &'a str, prefix: &str) -> &'a str {
    path.strip_prefix(prefix).filter(|rest| !rest.is_empty()).unwrap_or(path)
}

/// The current content of a file to modify or delete; for one to create, that it is missing.
fn read_base(path: &Path, shown: &str, change: Change, cancel: &Cancel) -> Result<Option<String>, String> {
    if change == Change::Create {
        return match fs::symlink_metadata(path) {
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(err) if err.kind() == io::ErrorKind::NotADirectory => {
                Err(format!("{shown}: a parent is not a directory, so it cannot be created"))
            }
            Err(err) => Err(format!("{shown}: {err}")),
            Ok(metadata) => {
                refuse_irregular(&metadata.file_type(), shown)?;
                Err(format!("{shown}: already exists, but the patch creates it (from /dev/null)"))
            }
        };
    }
    let bytes = read_whole(path, shown, EDIT_CAP_BYTES, cancel)?;
    String::from_utf8(bytes)
        .map(Some)
        .map_err(|_| format!("{shown}: is not UTF-8 text; apply_patch changes text files only"))
}

/// Compares the base read with the declared one (`None`: must not exist).
fn check_declared(shown: &str, base: Option<&str>, declared: Option<&str>) -> Result<(), String> {
    let current = base.map(|text| hex::encode(Sha256::digest(text.as_bytes())));
    match (declared, current) {
        (None, None) => Ok(()),
        (None, Some(current)) => {
            Err(format!("{shown}: exists (sha256 {current}), but expected_sha256 null requires that it does not"))
        }
        (Some(_), None) => Err(format!("{shown}: does not exist, so it cannot match expected_sha256")),
        (Some(declared), Some(current)) if declared == current => Ok(()),
        (Some(_), Some(current)) => {
            Err(format!("{shown}: does not match its expected_sha256; the current sha256 is {current}"))
        }
    }
}

/// Names the hunk that failed, with where it expected to apply.
fn hunk_problem(shown: &str, err: &diffy::ApplyError, patch: &diffy::Patch<'_, str>) -> String {
    // diffy's error says only "error applying hunk #N"; N is 1-based.
    let text = err.to_string();
    let number = text.rsplit('#').next().and_then(|n| n.trim().parse::<usize>().ok());
    let total = patch.hunks().len();
    match number.and_then(|n| patch.hunks().get(n.wrapping_sub(1)).map(|hunk| (n, hunk))) {
        Some((n, hunk)) => format!(
            "{shown}: hunk {n} of {total} (@@ -{},{} @@) does not match the file: its context and removed lines \
             are not there",
            hunk.old_range().start(),
            hunk.old_range().len()
        ),
        None => format!("{shown}: {text}"),
    }
}

/// The file operations of the commit step, so that tests can make one fail.
trait Disk {
    /// A synced temp file beside `path` holding `bytes`; creates the parent directories.
    fn write_temp(&mut self, path: &Path, bytes: &[u8]) -> io::Result<PathBuf>;
    fn rename(&mut self, from: &Path, to: &Path) -> io::Result<()>;
    fn remove(&mut self, path: &Path) -> io::Result<()>;
    /// Puts `bytes` back at `path`, atomically.
    fn restore(&mut self, path: &Path, bytes: &[u8]) -> io::Result<()>;
}

struct RealDisk;

impl Disk for RealDisk {
    fn write_temp(&mut self, path: &Path, bytes: &[u8]) -> io::Result<PathBuf> {
        write_temp(path, bytes)
    }

    fn rename(&mut self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn remove(&mut self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn restore(&mut self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        replace_atomically(path, bytes)
    }
}

/// How steps 2 and 3 ended.
#[derive(Debug)]
enum Committed {
    /// Every file carries the patch.
    All,
    /// Nothing was changed: `why` failed, and whatever had changed was put back.
    None { why: String },
    /// `why` failed, and putting some files back failed too: these (indices into the plan) carry
    /// the patch; the rest do not.
    Part { why: String, applied: Vec<usize>, rollback_errors: Vec<String> },
}

/// Steps 2 and 3.
fn commit(planned: &[Planned], disk: &mut dyn Disk) -> Committed {
    let created_dirs = missing_dirs(planned);
    // Step 2: stage every new content.
    let mut temps: Vec<Option<PathBuf>> = Vec::with_capacity(planned.len());
    for file in planned {
        let Some(new) = &file.new else {
            temps.push(None);
            continue;
        };
        match disk.write_temp(&file.path, new.as_bytes()) {
            Ok(temp) => temps.push(Some(temp)),
            Err(err) => {
                remove_temps(disk, temps.iter().flatten());
                remove_dirs(&created_dirs);
                return Committed::None { why: format!("{}: could not stage its new content: {err}", file.shown) };
            }
        }
    }
    // Step 3: rename into place; a deleted file is renamed aside until the end.
    let aside: Vec<PathBuf> = planned.iter().map(|file| aside_name(&file.path)).collect();
    for (at, file) in planned.iter().enumerate() {
        let renamed = match &temps[at] {
            Some(temp) => disk.rename(temp, &file.path),
            None => disk.rename(&file.path, &aside[at]),
        };
        let Err(err) = renamed else {
            continue;
        };
        let why = format!("{}: could not be {}: {err}", file.shown, file.change.word());
        remove_temps(disk, temps[at..].iter().flatten());
        let mut applied = Vec::new();
        let mut rollback_errors = Vec::new();
        for back in (0..at).rev() {
            let earlier = &planned[back];
            let undone = match earlier.change {
                Change::Modify => disk.restore(&earlier.path, earlier.base.as_deref().unwrap_or("").as_bytes()),
                Change::Create => disk.remove(&earlier.path),
                Change::Delete => disk.rename(&aside[back], &earlier.path),
            };
            if let Err(err) = undone {
                rollback_errors.push(format!("{}: could not be put back: {err}", earlier.shown));
                applied.push(back);
            }
        }
        if applied.is_empty() {
            remove_dirs(&created_dirs);
            return Committed::None { why };
        }
        applied.sort_unstable();
        remove_dirs(&created_dirs);
        // A deleted file whose put-back failed is still aside: finish its deletion.
        for &index in &applied {
            if planned[index].change == Change::Delete {
                let _ = disk.remove(&aside[index]);
            }
        }
        return Committed::Part { why, applied, rollback_errors };
    }
    for (at, file) in planned.iter().enumerate() {
        if file.change == Change::Delete
            && let Err(err) = disk.remove(&aside[at])
        {
            warn!(path = %aside[at].display(), error = %err, "could not remove a file apply_patch deleted");
        }
    }
    let dirs: BTreeSet<&Path> = planned.iter().filter_map(|file| file.path.parent()).collect();
    for dir in dirs {
        let _ = sync_parent(&dir.join("."));
    }
    Committed::All
}

/// Where a deleted file waits until the commit is through: a hidden name beside it.
fn aside_name(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    path.with_file_name(format!(".{name}.{:016x}.deleted", rand::random::<u64>()))
}

fn remove_temps<'a>(disk: &mut dyn Disk, temps: impl Iterator<Item = &'a PathBuf>) {
    for temp in temps {
        let _ = disk.remove(temp);
    }
}

/// The directories that creating the patch's new files will create, deepest first.
fn missing_dirs(planned: &[Planned]) -> Vec<PathBuf> {
    let mut missing = BTreeSet::new();
    for file in planned.iter().filter(|file| file.change == Change::Create) {
        let mut dir = file.path.parent();
        while let Some(at) = dir
            && at.symlink_metadata().is_err()
        {
            missing.insert(at.to_owned());
            dir = at.parent();
        }
    }
    // Deeper paths sort after their ancestors; undo them first.
    missing.into_iter().rev().collect()
}

/// Removes the directories a failed commit created (each only if empty).
fn remove_dirs(dirs: &[PathBuf]) {
    for dir in dirs {
        let _ = fs::remove_dir(dir);
    }
}

fn render(planned: &[Planned], committed: Committed) -> ToolOutcome {
    let all: Vec<&str> = planned.iter().map(|file| file.shown.as_str()).collect();
    match committed {
        Committed::All => {
            let mut content = format!("applied the patch to {} file(s):\n", planned.len());
            let mut files = Vec::new();
            for file in planned {
                let digest = file.new.as_ref().map(|text| hex::encode(Sha256::digest(text.as_bytes())));
                match &digest {
                    Some(digest) => content.push_str(&format!(
                        "- {} {} ({} hunk(s); sha256 {digest})\n",
                        file.change.word(),
                        file.shown,
                        file.hunks
                    )),
                    None => content.push_str(&format!("- deleted {}\n", file.shown)),
                }
                files.push(json!({
                    "path": file.shown, "change": file.change.word(), "hunks": file.hunks, "sha256": digest,
                }));
            }
            ToolOutcome::Completed {
                content,
                structured_content: json!({ "applied": all, "not_applied": [], "files": files }),
                is_error: false,
            }
        }
        Committed::None { why } => ToolOutcome::Completed {
            content: format!("the patch was not applied, and no file was changed: {why}"),
            structured_content: json!({ "applied": [], "not_applied": all, "problems": [why] }),
            is_error: true,
        },
        Committed::Part { why, applied, rollback_errors } => {
            let done: Vec<&str> = applied.iter().map(|at| all[*at]).collect();
            let not_done: Vec<&str> =
                all.iter().enumerate().filter(|(at, _)| !applied.contains(at)).map(|(_, path)| *path).collect();
            let content = format!(
                "the patch was applied only in part: {why}; putting the changed files back failed for some \
                 ({}).\ncarry the patch: {}\ndo not: {}\n",
                rollback_errors.join("; "),
                done.join(", "),
                if not_done.is_empty() { "(none)".to_owned() } else { not_done.join(", ") }
            );
            let mut problems = vec![why];
            problems.extend(rollback_errors);
            ToolOutcome::Completed {
                content,
                structured_content: json!({ "applied": done, "not_applied": not_done, "problems": problems }),
                is_error: true,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::tools::test_workdir as workdir;

    fn run(workdir: &Path, input: Value) -> (String, Value, bool) {
        apply_patch(workdir, input.as_object().unwrap(), &Cancel::never()).into_parts()
    }

    fn sha(text: &str) -> String {
        hex::encode(Sha256::digest(text.as_bytes()))
    }

    /// Every file under `dir` (names relative to it, hidden ones included) and its content.
    fn snapshot(dir: &Path) -> Vec<(String, String)> {
        let mut files = Vec::new();
        let mut stack = vec![dir.to_owned()];
        while let Some(at) = stack.pop() {
            for entry in fs::read_dir(&at).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path.clone());
                    files.push((display(dir, &path) + "/", String::new()));
                } else {
                    files.push((display(dir, &path), fs::read_to_string(&path).unwrap()));
                }
            }
        }
        files.sort();
        files
    }

    const TWO_FILES: &str = "\
--- a/one.txt
+++ b/one.txt
@@ -1,3 +1,3 @@
 alpha
-beta
+BETA
 gamma
--- /dev/null
+++ b/new/dir/two.txt
@@ -0,0 +1,2 @@
+fresh
+file
--- a/gone.txt
+++ /dev/null
@@ -1 +0,0 @@
-bye
";

    fn seed(workdir: &Path) {
        fs::write(workdir.join("one.txt"), "alpha\nbeta\ngamma\n").unwrap();
        fs::write(workdir.join("gone.txt"), "bye\n").unwrap();
    }

    #[test]
    fn apply_patch_modifies_creates_and_deletes_files_together() {
        let (_dir, workdir) = workdir();
        seed(&workdir);
        let expected = json!({"one.txt": sha("alpha\nbeta\ngamma\n"), "new/dir/two.txt": null});
        let (content, structured, is_error) = run(&workdir, json!({"patch": TWO_FILES, "expected_sha256": expected}));
        assert!(!is_error, "{content}");
        assert_eq!(
            snapshot(&workdir),
            [
                ("new/".to_owned(), String::new()),
                ("new/dir/".to_owned(), String::new()),
                ("new/dir/two.txt".to_owned(), "fresh\nfile\n".to_owned()),
                ("one.txt".to_owned(), "alpha\nBETA\ngamma\n".to_owned()),
            ],
            "no temp or set-aside file is left"
        );
        assert_eq!(structured["applied"], json!(["one.txt", "new/dir/two.txt", "gone.txt"]));
        assert_eq!(structured["not_applied"], json!([]));
        assert_eq!(structured["files"][0]["sha256"], sha("alpha\nBETA\ngamma\n"));
        assert_eq!(structured["files"][2]["change"], "deleted");
        assert!(content.contains("- deleted gone.txt"), "{content}");
    }

    #[test]
    fn one_failing_hunk_leaves_every_file_untouched() {
        let (_dir, workdir) = workdir();
        seed(&workdir);
        fs::write(workdir.join("three.txt"), "x\ny\nz\n").unwrap();
        let patch = format!(
            "{TWO_FILES}--- a/three.txt\n+++ b/three.txt\n@@ -1,3 +1,3 @@\n x\n-y\n+Y\n z\n@@ -10,2 +10,2 @@\n nope\n-not here\n+changed\n"
        );
        let before = snapshot(&workdir);
        let (content, structured, is_error) = run(&workdir, json!({"patch": patch}));
        assert!(is_error);
        assert!(content.contains("three.txt: hunk 2 of 2 (@@ -10,2 @@) does not match"), "{content}");
        assert_eq!(structured["applied"], json!([]));
        assert_eq!(snapshot(&workdir), before, "nothing changed, not even the files whose hunks fit");
    }

    #[test]
    fn bases_that_do_not_match_refuse_the_whole_patch_naming_each_file() {
        let (_dir, workdir) = workdir();
        seed(&workdir);
        fs::write(workdir.join("new"), "a file where a directory would go").unwrap();
        let before = snapshot(&workdir);
        let expected = json!({"one.txt": sha("stale"), "gone.txt": null, "unrelated.txt": null});
        let (content, structured, is_error) = run(&workdir, json!({"patch": TWO_FILES, "expected_sha256": expected}));
        assert!(is_error);
        let problems: Vec<&str> =
            structured["problems"].as_array().unwrap().iter().map(|p| p.as_str().unwrap()).collect();
        assert_eq!(problems.len(), 4, "{content}");
        assert!(problems[0].starts_with("one.txt: does not match its expected_sha256"), "{problems:?}");
        assert!(problems[1].starts_with("new/dir/two.txt: a parent is not a directory"), "{problems:?}");
        assert!(problems[2].starts_with("gone.txt: exists"), "{problems:?}");
        assert!(problems[3].contains("names unrelated.txt"), "{problems:?}");
        assert_eq!(snapshot(&workdir), before);

        // A file to create that exists, a file to change that does not, an escape, garbage.
        fs::write(workdir.join("exists.txt"), "e").unwrap();
        let cases = [
            ("--- /dev/null\n+++ b/exists.txt\n@@ -0,0 +1 @@\n+x\n", "already exists"),
            ("--- a/missing.txt\n+++ b/missing.txt\n@@ -1 +1 @@\n-a\n+b\n", "no such file"),
            ("--- a/../escape.txt\n+++ b/../escape.txt\n@@ -1 +1 @@\n-a\n+b\n", "escapes the working directory"),
            ("--- a/one.txt\n+++ b/other.txt\n@@ -1 +1 @@\n-alpha\n+b\n", "renames are not supported"),
            ("this is not a patch\n", "does not parse"),
            ("--- a/gone.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-not the content\n", "does not match"),
        ];
        for (patch, problem) in cases {
            let (content, _, is_error) = run(&workdir, json!({"patch": patch}));
            assert!(is_error, "{patch}");
            assert!(content.contains(problem), "{patch}: {content}");
        }
        let (content, _, is_error) = run(&workdir, json!({"patch": 3}));
        assert!(is_error && content.contains("must be a string"));
        assert_eq!(fs::read_to_string(workdir.join("one.txt")).unwrap(), "alpha\nbeta\ngamma\n");
    }

    #[test]
    fn git_diff_output_applies() {
        let (_dir, workdir) = workdir();
        fs::write(workdir.join("lib.rs"), "fn a() {}\n").unwrap();
        let patch = "diff --git a/lib.rs b/lib.rs\nindex 1111111..2222222 100644\n--- a/lib.rs\n+++ b/lib.rs\n\
                     @@ -1 +1,2 @@\n fn a() {}\n+fn b() {}\ndiff --git a/src/new.rs b/src/new.rs\nnew file mode 100644\n\
                     index 0000000..3333333\n--- /dev/null\n+++ b/src/new.rs\n@@ -0,0 +1 @@\n+pub fn c() {}\n";
        let (content, _, is_error) = run(&workdir, json!({"patch": patch}));
        assert!(!is_error, "{content}");
        assert_eq!(fs::read_to_string(workdir.join("lib.rs")).unwrap(), "fn a() {}\nfn b() {}\n");
        assert_eq!(fs::read_to_string(workdir.join("src/new.rs")).unwrap(), "pub fn c() {}\n");
    }

    /// The real disk, but the `fail_rename`-th rename (0-based) fails, and so does every restore
    /// when `fail_restore`.
    struct Flaky {
        renames: usize,
        fail_rename: usize,
        fail_restore: bool,
    }

    impl Disk for Flaky {
        fn write_temp(&mut self, path: &Path, bytes: &[u8]) -> io::Result<PathBuf> {
            RealDisk.write_temp(path, bytes)
        }

        fn rename(&mut self, from: &Path, to: &Path) -> io::Result<()> {
            self.renames += 1;
            if self.renames - 1 == self.fail_rename {
                return Err(io::Error::other("injected rename failure"));
            }
            RealDisk.rename(from, to)
        }

        fn remove(&mut self, path: &Path) -> io::Result<()> {
            RealDisk.remove(path)
        }

        fn restore(&mut self, path: &Path, bytes: &[u8]) -> io::Result<()> {
            if self.fail_restore {
                return Err(io::Error::other("injected restore failure"));
            }
            RealDisk.restore(path, bytes)
        }
    }

    fn plan(workdir: &Path, patch: &str) -> Vec<Planned> {
        check(workdir, patch, HashMap::new(), &Cancel::never()).unwrap()
    }

    #[test]
    fn a_rename_failing_midway_puts_back_what_was_changed() {
        let (_dir, workdir) = workdir();
        seed(&workdir);
        let before = snapshot(&workdir);
        let planned = plan(&workdir, TWO_FILES);
        // one.txt and two.txt are renamed in; gone.txt's rename aside fails.
        let committed = commit(&planned, &mut Flaky { renames: 0, fail_rename: 2, fail_restore: false });
        assert!(matches!(&committed, Committed::None { why } if why.contains("gone.txt")), "{committed:?}");
        assert_eq!(snapshot(&workdir), before, "every file is back as it was, and new/dir/ is gone");
        let ToolOutcome::Completed { structured_content, is_error, .. } = render(&planned, committed) else {
            panic!("completed")
        };
        assert!(is_error);
        assert_eq!(structured_content["applied"], json!([]));
        assert_eq!(structured_content["not_applied"], json!(["one.txt", "new/dir/two.txt", "gone.txt"]));
    }

    #[test]
    fn a_failed_put_back_lists_exactly_what_was_applied() {
        let (_dir, workdir) = workdir();
        seed(&workdir);
        let planned = plan(&workdir, TWO_FILES);
        let committed = commit(&planned, &mut Flaky { renames: 0, fail_rename: 2, fail_restore: true });
        let ToolOutcome::Completed { content, structured_content, is_error } = render(&planned, committed) else {
            panic!("completed")
        };
        assert!(is_error);
        // one.txt could not be restored; two.txt was removed again; gone.txt was never touched.
        assert_eq!(structured_content["applied"], json!(["one.txt"]), "{content}");
        assert_eq!(structured_content["not_applied"], json!(["new/dir/two.txt", "gone.txt"]));
        assert_eq!(fs::read_to_string(workdir.join("one.txt")).unwrap(), "alpha\nBETA\ngamma\n");
        assert!(!workdir.join("new/dir/two.txt").exists());
        assert_eq!(fs::read_to_string(workdir.join("gone.txt")).unwrap(), "bye\n");
        let names: Vec<(String, String)> = snapshot(&workdir);
        assert!(names.iter().all(|(name, _)| !name.contains(".tmp") && !name.contains(".deleted")), "{names:?}");
    }
}
