//! `read_file`, `write_file` and `list_dir`: blocking file work, run on the blocking pool, every
//! path confined to the workdir.

use std::fs;
use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::path::Path;

use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use super::ToolOutcome;
use super::args::{optional_positive, optional_str, required_str};
use super::paths::{display, resolve_existing, resolve_for_write};

/// read_file returns at most this many bytes of text. The text travels twice (content and
/// structured_content), and both must fit the 1 MB commit bound.
pub(super) const READ_CAP_BYTES: usize = 512 * 1024;
/// list_dir lists at most this many entries.
pub(super) const LIST_CAP_ENTRIES: usize = 2_000;

/// `read_file {path, offset?, limit?}`.
pub(super) fn read_file(workdir: &Path, input: &Map<String, Value>) -> ToolOutcome {
    let parsed = required_str(input, "path")
        .and_then(|path| Ok((path, optional_positive(input, "offset")?, optional_positive(input, "limit")?)));
    let (requested, offset, limit) = match parsed {
        Ok(parsed) => parsed,
        Err(message) => return ToolOutcome::error(message),
    };
    let path = match resolve_existing(workdir, requested) {
        Ok(path) => path,
        Err(message) => return ToolOutcome::error(message),
    };
    if path.is_dir() {
        return ToolOutcome::error(format!("{requested}: is a directory; use list_dir"));
    }
    let first = offset.unwrap_or(1);
    let window = Window { first, last: limit.map(|n| first.saturating_add(n - 1)) };
    let read = match read_window(&path, window) {
        Ok(read) => read,
        Err(err) => return ToolOutcome::error(format!("{requested}: {err}")),
    };
    let shown = display(workdir, &path);
    if read.total_lines > 0 && first > read.total_lines {
        return ToolOutcome::error(format!(
            "{shown}: offset {first} is past the end of the file ({} lines)",
            read.total_lines
        ));
    }
    let lines = if read.last_line >= first {
        format!("{first}-{} of {}", read.last_line, read.total_lines)
    } else {
        format!("none of {}", read.total_lines)
    };
    let mut content = format!("path: {shown}\nsha256: {}\nlines: {lines}\n---\n{}", read.sha256, read.text);
    if read.truncated {
        content.push_str(&format!("\n[cut after {READ_CAP_BYTES} bytes; continue with offset {}]", read.last_line + 1));
    }
    ToolOutcome::Completed {
        structured_content: json!({
            "path": shown,
            "sha256": read.sha256,
            "content": read.text,
            "truncated": read.truncated,
            "total_lines": read.total_lines,
        }),
        content,
        is_error: false,
    }
}

#[derive(Clone, Copy)]
struct Window {
    first: u64,
    last: Option<u64>,
}

struct WindowRead {
    text: String,
    sha256: String,
    total_lines: u64,
    /// The last line whose text is (fully) in `text`; `first - 1` when none is.
    last_line: u64,
    truncated: bool,
}

/// Streams the file once: digests all of it, keeps the window's lines up to the cap.
fn read_window(path: &Path, window: Window) -> std::io::Result<WindowRead> {
    let mut reader = BufReader::new(fs::File::open(path)?);
    let mut hasher = Sha256::new();
    let mut kept = Vec::new();
    let mut line = Vec::new();
    let mut total_lines = 0;
    let mut last_line = window.first - 1;
    let mut truncated = false;
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line)? == 0 {
            break;
        }
        hasher.update(&line);
        total_lines += 1;
        let in_window = total_lines >= window.first && window.last.is_none_or(|last| total_lines <= last);
        if !in_window || truncated {
            continue;
        }
        if kept.len() + line.len() <= READ_CAP_BYTES {
            kept.extend_from_slice(&line);
            last_line = total_lines;
        } else {
            truncated = true;
            if kept.is_empty() {
                // One line longer than the cap: show its head rather than nothing.
                kept.extend_from_slice(&line[..READ_CAP_BYTES]);
            }
        }
    }
    Ok(WindowRead {
        text: String::from_utf8_lossy(&kept).into_owned(),
        sha256: hex::encode(hasher.finalize()),
        total_lines,
        last_line,
        truncated,
    })
}

/// `write_file {path, content, expected_sha256?}`: absent `expected_sha256` skips the check,
/// `null` requires that the file does not exist, a digest must match the current file.
pub(super) fn write_file(workdir: &Path, input: &Map<String, Value>) -> ToolOutcome {
    let parsed = required_str(input, "path")
        .and_then(|path| Ok((path, required_str(input, "content")?, optional_str(input, "expected_sha256")?)));
    let (requested, content, expected) = match parsed {
        Ok(parsed) => parsed,
        Err(message) => return ToolOutcome::error(message),
    };
    let must_not_exist = matches!(input.get("expected_sha256"), Some(Value::Null));
    let path = match resolve_for_write(workdir, requested) {
        Ok(path) => path,
        Err(message) => return ToolOutcome::error(message),
    };
    let shown = display(workdir, &path);
    if path.is_dir() {
        return ToolOutcome::error(format!("{shown}: is a directory"));
    }
    let current = match file_sha256(&path) {
        Ok(current) => current,
        Err(err) => return ToolOutcome::error(format!("{shown}: {err}")),
    };
    match (&current, expected) {
        (Some(digest), _) if must_not_exist => {
            return ToolOutcome::error(format!(
                "{shown}: already exists (sha256 {digest}); expected_sha256 null requires a new file"
            ));
        }
        (None, Some(_)) => {
            return ToolOutcome::error(format!("{shown}: does not exist, so it cannot match expected_sha256"));
        }
        (Some(digest), Some(expected)) if !digest.eq_ignore_ascii_case(expected) => {
            return ToolOutcome::error(format!(
                "{shown}: expected_sha256 does not match; the current sha256 is {digest}"
            ));
        }
        _ => {}
    }
    if let Err(err) = replace_atomically(&path, content.as_bytes()) {
        return ToolOutcome::error(format!("{shown}: {err}"));
    }
    let digest = hex::encode(Sha256::digest(content.as_bytes()));
    ToolOutcome::Completed {
        content: format!("wrote {} bytes to {shown} (sha256 {digest})", content.len()),
        structured_content: json!({ "path": shown, "sha256": digest, "bytes": content.len() }),
        is_error: false,
    }
}

fn file_sha256(path: &Path) -> std::io::Result<Option<String>> {
    match fs::File::open(path) {
        Ok(mut file) => {
            let mut hasher = Sha256::new();
            std::io::copy(&mut file, &mut hasher)?;
            Ok(Some(hex::encode(hasher.finalize())))
        }
        Err(err) if err.kind() == ErrorKind::NotFound => Ok(None),
        Err(err) => Err(err),
    }
}

/// Temp file beside the target, fsync, rename over it, fsync the directory. Keeps an existing
/// file's permissions.
fn replace_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().ok_or_else(|| std::io::Error::other("no parent directory"))?;
    fs::create_dir_all(dir)?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let temp = dir.join(format!(".{name}.{:016x}.tmp", rand::random::<u64>()));
    let result = (|| {
        let mut file = fs::OpenOptions::new().write(true).create_new(true).open(&temp)?;
        file.write_all(bytes)?;
        if let Ok(metadata) = fs::metadata(path) {
            file.set_permissions(metadata.permissions())?;
        }
        file.sync_all()?;
        fs::rename(&temp, path)?;
        fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(&temp);
    }
    result
}

/// `list_dir {path?}`.
pub(super) fn list_dir(workdir: &Path, input: &Map<String, Value>) -> ToolOutcome {
    let requested = match optional_str(input, "path") {
        Ok(path) => path.unwrap_or("."),
        Err(message) => return ToolOutcome::error(message),
    };
    let path = match resolve_existing(workdir, requested) {
        Ok(path) => path,
        Err(message) => return ToolOutcome::error(message),
    };
    let shown = display(workdir, &path);
    let read = fs::read_dir(&path).map_err(|err| match err.kind() {
        ErrorKind::NotADirectory => format!("{shown}: is not a directory; use read_file"),
        _ => format!("{shown}: {err}"),
    });
    let mut entries: Vec<(String, &'static str, u64)> = match read {
        Ok(read) => read
            .filter_map(Result::ok)
            .map(|entry| {
                let name = entry.file_name().to_string_lossy().into_owned();
                let metadata = entry.metadata().ok();
                let kind = match metadata.as_ref().map(fs::Metadata::file_type) {
                    Some(t) if t.is_symlink() => "symlink",
                    Some(t) if t.is_dir() => "dir",
                    Some(t) if t.is_file() => "file",
                    _ => "other",
                };
                (name, kind, metadata.map_or(0, |m| m.len()))
            })
            .collect(),
        Err(message) => return ToolOutcome::error(message),
    };
    entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let total = entries.len();
    let truncated = total > LIST_CAP_ENTRIES;
    entries.truncate(LIST_CAP_ENTRIES);
    let mut content = format!("path: {shown}\n");
    for (name, kind, size) in &entries {
        content.push_str(&match *kind {
            "dir" => format!("dir      {name}/\n"),
            "file" => format!("file     {name} ({size} bytes)\n"),
            other => format!("{other:<8} {name}\n"),
        });
    }
    if truncated {
        content.push_str(&format!("[showing the first {LIST_CAP_ENTRIES} of {total} entries]\n"));
    } else if total == 0 {
        content.push_str("(empty)\n");
    }
    let listed: Vec<Value> =
        entries.iter().map(|(name, kind, size)| json!({ "name": name, "type": kind, "size": size })).collect();
    ToolOutcome::Completed {
        content,
        structured_content: json!({ "path": shown, "entries": listed, "truncated": truncated }),
        is_error: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workdir() -> (tempfile::TempDir, std::path::PathBuf) {
        let root = tempfile::tempdir().unwrap();
        let workdir = root.path().join("work");
        fs::create_dir(&workdir).unwrap();
        let workdir = workdir.canonicalize().unwrap();
        (root, workdir)
    }

    fn input(value: Value) -> Map<String, Value> {
        value.as_object().unwrap().clone()
    }

    fn completed(outcome: ToolOutcome) -> (String, Value, bool) {
        match outcome {
            ToolOutcome::Completed { content, structured_content, is_error } => (content, structured_content, is_error),
            ToolOutcome::Failed { content } => panic!("failed: {content}"),
        }
    }

    fn sha(text: &str) -> String {
        hex::encode(Sha256::digest(text.as_bytes()))
    }

    #[test]
    fn read_file_returns_a_line_window_and_the_whole_file_digest() {
        let (_root, workdir) = workdir();
        let text = "one\ntwo\nthree\nfour\n";
        fs::write(workdir.join("f.txt"), text).unwrap();

        let (content, structured, is_error) = completed(read_file(&workdir, &input(json!({"path": "f.txt"}))));
        assert!(!is_error);
        assert_eq!(structured["content"], text);
        assert_eq!(structured["sha256"], sha(text));
        assert_eq!(structured["path"], "f.txt");
        assert_eq!(structured["total_lines"], 4);
        assert!(content.starts_with(&format!("path: f.txt\nsha256: {}\nlines: 1-4 of 4\n---\n", sha(text))));
        assert!(content.ends_with(text));

        let (content, structured, _) =
            completed(read_file(&workdir, &input(json!({"path": "f.txt", "offset": 2, "limit": 2}))));
        assert_eq!(structured["content"], "two\nthree\n");
        assert_eq!(structured["sha256"], sha(text));
        assert!(content.contains("lines: 2-3 of 4"));

        let (content, _, is_error) = completed(read_file(&workdir, &input(json!({"path": "f.txt", "offset": 9}))));
        assert!(is_error);
        assert!(content.contains("past the end"));
        let (content, _, is_error) = completed(read_file(&workdir, &input(json!({"path": "f.txt", "offset": 0}))));
        assert!(is_error);
        assert!(content.contains("`offset` must be a positive integer"));
    }

    #[test]
    fn read_file_caps_its_text_and_says_where_to_continue() {
        let (_root, workdir) = workdir();
        let line = format!("{}\n", "x".repeat(1023));
        let text = line.repeat(READ_CAP_BYTES / 1024 + 10);
        fs::write(workdir.join("big.txt"), &text).unwrap();
        let (content, structured, is_error) = completed(read_file(&workdir, &input(json!({"path": "big.txt"}))));
        assert!(!is_error);
        assert_eq!(structured["truncated"], true);
        assert_eq!(structured["content"].as_str().unwrap().len(), READ_CAP_BYTES);
        assert_eq!(structured["sha256"], sha(&text));
        let next = READ_CAP_BYTES / 1024 + 1;
        assert!(content.ends_with(&format!("continue with offset {next}]")), "{}", &content[content.len() - 80..]);
    }

    #[test]
    fn read_file_refuses_escapes_and_directories() {
        let (root, workdir) = workdir();
        fs::write(root.path().join("secret"), "s").unwrap();
        std::os::unix::fs::symlink(root.path().join("secret"), workdir.join("link")).unwrap();
        for path in ["../secret", "link", "/etc/hostname"] {
            let (content, _, is_error) = completed(read_file(&workdir, &input(json!({"path": path}))));
            assert!(is_error, "{path}");
            assert!(content.contains("escapes the working directory"), "{path}: {content}");
        }
        let (content, _, is_error) = completed(read_file(&workdir, &input(json!({"path": "."}))));
        assert!(is_error);
        assert!(content.contains("is a directory"));
        let (content, _, is_error) = completed(read_file(&workdir, &input(json!({}))));
        assert!(is_error);
        assert_eq!(content, "`path` is required");
    }

    #[test]
    fn write_file_checks_the_digest_and_writes_atomically() {
        let (_root, workdir) = workdir();
        // null: the file must not exist yet.
        let (_, structured, is_error) = completed(write_file(
            &workdir,
            &input(json!({"path": "d/new.txt", "content": "v1", "expected_sha256": null})),
        ));
        assert!(!is_error);
        assert_eq!(structured, json!({"path": "d/new.txt", "sha256": sha("v1"), "bytes": 2}));
        assert_eq!(fs::read_to_string(workdir.join("d/new.txt")).unwrap(), "v1");
        let (content, _, is_error) = completed(write_file(
            &workdir,
            &input(json!({"path": "d/new.txt", "content": "v2", "expected_sha256": null})),
        ));
        assert!(is_error);
        assert!(content.contains(&sha("v1")), "{content}");

        // A stale digest is refused and names the current one; the file is untouched.
        let (content, _, is_error) = completed(write_file(
            &workdir,
            &input(json!({"path": "d/new.txt", "content": "v2", "expected_sha256": sha("v0")})),
        ));
        assert!(is_error);
        assert!(content.contains(&format!("the current sha256 is {}", sha("v1"))));
        assert_eq!(fs::read_to_string(workdir.join("d/new.txt")).unwrap(), "v1");

        // The right digest (any case) replaces it; absent skips the check.
        let (_, structured, is_error) = completed(write_file(
            &workdir,
            &input(json!({"path": "d/new.txt", "content": "v2", "expected_sha256": sha("v1").to_uppercase()})),
        ));
        assert!(!is_error);
        assert_eq!(structured["sha256"], sha("v2"));
        let (_, _, is_error) = completed(write_file(&workdir, &input(json!({"path": "d/new.txt", "content": "v3"}))));
        assert!(!is_error);
        assert_eq!(fs::read_to_string(workdir.join("d/new.txt")).unwrap(), "v3");
        let (content, _, is_error) = completed(write_file(
            &workdir,
            &input(json!({"path": "d/missing.txt", "content": "x", "expected_sha256": sha("x")})),
        ));
        assert!(is_error);
        assert!(content.contains("does not exist"));

        // No temp files are left behind.
        let names: Vec<String> = fs::read_dir(workdir.join("d"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["new.txt"]);
    }

    #[test]
    fn write_file_refuses_escapes() {
        let (root, workdir) = workdir();
        fs::write(root.path().join("secret"), "s").unwrap();
        std::os::unix::fs::symlink(root.path().join("secret"), workdir.join("link")).unwrap();
        std::os::unix::fs::symlink(root.path(), workdir.join("up")).unwrap();
        for path in ["../evil.txt", "link", "up/evil.txt", "a/../../evil.txt"] {
            let (content, _, is_error) = completed(write_file(&workdir, &input(json!({"path": path, "content": "x"}))));
            assert!(is_error, "{path}");
            assert!(content.contains("escapes the working directory"), "{path}: {content}");
        }
        assert_eq!(fs::read_to_string(root.path().join("secret")).unwrap(), "s");
        assert!(!root.path().join("evil.txt").exists());
    }

    #[test]
    fn list_dir_sorts_entries_with_type_and_size() {
        let (_root, workdir) = workdir();
        fs::write(workdir.join("b.txt"), "12345").unwrap();
        fs::create_dir(workdir.join("a")).unwrap();
        std::os::unix::fs::symlink("b.txt", workdir.join("c")).unwrap();
        let (content, structured, is_error) = completed(list_dir(&workdir, &input(json!({}))));
        assert!(!is_error);
        assert_eq!(structured["path"], ".");
        let entries = structured["entries"].as_array().unwrap();
        let summary: Vec<(&str, &str)> =
            entries.iter().map(|e| (e["name"].as_str().unwrap(), e["type"].as_str().unwrap())).collect();
        assert_eq!(summary, [("a", "dir"), ("b.txt", "file"), ("c", "symlink")]);
        assert_eq!(entries[1]["size"], 5);
        assert!(content.contains("file     b.txt (5 bytes)"));
        let (content, _, is_error) = completed(list_dir(&workdir, &input(json!({"path": ".."}))));
        assert!(is_error);
        assert!(content.contains("escapes the working directory"));
    }
}
