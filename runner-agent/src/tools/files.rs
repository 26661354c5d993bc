//! `read_file`, `write_file` and `list_dir`: blocking file work, run on a thread a timeout or a
//! stop can abandon ([`super::blocking`]), every path confined to the workdir.
//!
//! Every read is bounded while it reads, never after: only regular files are opened (a FIFO, a
//! socket or a device is refused, checked without blocking), read in [`CHUNK_BYTES`] at a time,
//! and at most [`READ_CAP_BYTES`] of text (each line at most [`LINE_CAP_BYTES`]) is kept. A file
//! over [`DIGEST_CAP_BYTES`] is not digested: it is read only as far as the requested lines.
//! Each loop checks its [`Cancel`] so an abandoned call stops at its next chunk.

use std::collections::BinaryHeap;
use std::fs;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use super::ToolOutcome;
use super::args::{optional_positive, optional_str, required_str};
use super::blocking::Cancel;
use super::paths::{display, resolve_existing, resolve_for_write};

/// read_file returns at most this many bytes of text. The text travels twice (content and
/// structured_content), and both must fit the 1 MB commit bound.
pub(super) const READ_CAP_BYTES: usize = 512 * 1024;
/// read_file keeps at most this many bytes of one line; the rest of it is skipped, with a mark.
pub(super) const LINE_CAP_BYTES: usize = 64 * 1024;
/// Files up to this size are read whole for their SHA-256 and line count (read_file, and
/// write_file's `expected_sha256` check); a larger one gets neither.
pub(super) const DIGEST_CAP_BYTES: u64 = 64 * 1024 * 1024;
/// Bytes read from a file at a time.
const CHUNK_BYTES: usize = 64 * 1024;
/// list_dir lists at most this many entries.
pub(super) const LIST_CAP_ENTRIES: usize = 2_000;

/// Why a call's work stopped before its answer: its caller is gone.
pub(super) const ABANDONED: &str = "abandoned by its call";

/// Opens `path` for reading if it is a regular file, without blocking: the type is checked
/// before opening (so a device is never opened), and again on the open file (so a file swapped
/// in between is caught); `O_NONBLOCK` keeps the open of a swapped-in FIFO from waiting for a
/// writer, and `O_NOFOLLOW` refuses a swapped-in symlink. `shown` names the path in the error.
pub(super) fn open_regular(path: &Path, shown: &str) -> Result<(fs::File, fs::Metadata), String> {
    let before = fs::symlink_metadata(path).map_err(|err| format!("{shown}: {err}"))?;
    refuse_irregular(&before.file_type(), shown)?;
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_NOCTTY)
        .open(path)
        .map_err(|err| format!("{shown}: {err}"))?;
    let metadata = file.metadata().map_err(|err| format!("{shown}: {err}"))?;
    refuse_irregular(&metadata.file_type(), shown)?;
    Ok((file, metadata))
}

pub(super) fn refuse_irregular(kind: &fs::FileType, shown: &str) -> Result<(), String> {
    let what = if kind.is_file() {
        return Ok(());
    } else if kind.is_dir() {
        return Err(format!("{shown}: is a directory; use list_dir"));
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_block_device() || kind.is_char_device() {
        "a device"
    } else {
        "not a regular file"
    };
    Err(format!("{shown}: is {what}; the file tools read and write regular files only"))
}

/// `read_file {path, offset?, limit?}`.
pub(super) fn read_file(workdir: &Path, input: &Map<String, Value>, cancel: &Cancel) -> ToolOutcome {
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
    let shown = display(workdir, &path);
    let (file, metadata) = match open_regular(&path, &shown) {
        Ok(opened) => opened,
        Err(message) => return ToolOutcome::error(message),
    };
    let size = metadata.len();
    let first = offset.unwrap_or(1);
    let window = Window { first, last: limit.map(|n| first.saturating_add(n - 1)) };
    let read = match read_window(file, window, size <= DIGEST_CAP_BYTES, cancel) {
        Ok(read) => read,
        Err(err) => return ToolOutcome::error(format!("{shown}: {err}")),
    };
    if let Some(total) = read.total_lines
        && total > 0
        && first > total
    {
        return ToolOutcome::error(format!("{shown}: offset {first} is past the end of the file ({total} lines)"));
    }
    let of = read.total_lines.map_or_else(|| "?".to_owned(), |total| total.to_string());
    let lines =
        if read.last_line >= first { format!("{first}-{} of {of}", read.last_line) } else { format!("none of {of}") };
    let sha256_line = match &read.sha256 {
        Some(digest) => digest.clone(),
        None => format!(
            "(none: the file is {size} bytes, over the {DIGEST_CAP_BYTES}-byte bound for the digest and line count)"
        ),
    };
    let mut content = format!("path: {shown}\nsha256: {sha256_line}\nlines: {lines}\n---\n{}", read.marked_text());
    if read.truncated {
        content.push_str(&format!("\n[cut after {READ_CAP_BYTES} bytes; continue with offset {}]", read.last_line + 1));
    }
    let cut_lines: Vec<u64> = read.cuts.iter().map(|(_, line)| *line).collect();
    ToolOutcome::Completed {
        structured_content: json!({
            "path": shown,
            "sha256": read.sha256,
            "content": String::from_utf8_lossy(&read.kept),
            "truncated": read.truncated,
            "total_lines": read.total_lines,
            "size": size,
            "cut_lines": cut_lines,
        }),
        content,
        is_error: false,
    }
}

/// Lines `first..=last` (1-based; `last: None` means to the end).
#[derive(Clone, Copy, Debug)]
struct Window {
    first: u64,
    last: Option<u64>,
}

#[derive(Debug)]
struct WindowRead {
    /// The window's text as read: each line at most [`LINE_CAP_BYTES`], in all at most
    /// [`READ_CAP_BYTES`].
    kept: Vec<u8>,
    /// Where in `kept` a line was cut, and its number.
    cuts: Vec<(usize, u64)>,
    /// The whole file's digest, when it was read whole and digested.
    sha256: Option<String>,
    /// The file's line count, when it was read to its end.
    total_lines: Option<u64>,
    /// The last line whose text is (as far as kept) in `kept`; `first - 1` when none is.
    last_line: u64,
    /// The window did not fit [`READ_CAP_BYTES`].
    truncated: bool,
}

impl WindowRead {
    /// The text with a mark where each cut line's head ends.
    fn marked_text(&self) -> String {
        let mut text = String::new();
        let mut from = 0;
        for (at, line) in &self.cuts {
            text.push_str(&String::from_utf8_lossy(&self.kept[from..*at]));
            text.push_str(&format!(" [line {line} cut after {LINE_CAP_BYTES} bytes]"));
            from = *at;
        }
        text.push_str(&String::from_utf8_lossy(&self.kept[from..]));
        text
    }
}

/// Streams `reader` once, [`CHUNK_BYTES`] at a time, keeping the window's lines within the caps.
/// With `digest` it reads to the end, digesting and counting lines, unless the input turns out
/// larger than [`DIGEST_CAP_BYTES`]; without, it stops as soon as the window is read (or full).
/// Memory stays within the caps whatever the input: no line is ever held whole.
fn read_window(mut reader: impl Read, window: Window, digest: bool, cancel: &Cancel) -> std::io::Result<WindowRead> {
    let mut hasher = digest.then(Sha256::new);
    let mut buf = vec![0u8; CHUNK_BYTES];
    let mut kept: Vec<u8> = Vec::new();
    let mut cuts: Vec<(usize, u64)> = Vec::new();
    let mut read_bytes: u64 = 0;
    // The line the next byte belongs to, the bytes of it seen so far, and where it starts in
    // `kept`.
    let mut line: u64 = 1;
    let mut line_bytes: usize = 0;
    let mut line_start: usize = 0;
    let mut last_line = window.first - 1;
    let mut truncated = false;
    let mut eof = false;
    loop {
        let window_done =
            truncated || window.last.is_some_and(|last| line > last || (line == last && line_bytes > LINE_CAP_BYTES));
        if hasher.is_none() && window_done {
            break;
        }
        if cancel.abandoned() {
            return Err(std::io::Error::other(ABANDONED));
        }
        let n = match reader.read(&mut buf) {
            Ok(0) => {
                eof = true;
                break;
            }
            Ok(n) => n,
            Err(err) if err.kind() == ErrorKind::Interrupted => continue,
            Err(err) => return Err(err),
        };
        let chunk = &buf[..n];
        read_bytes += n as u64;
        if read_bytes > DIGEST_CAP_BYTES {
            // It grew past the bound while being read: no digest after all.
            hasher = None;
        }
        if let Some(hasher) = &mut hasher {
            hasher.update(chunk);
        }
        let mut rest = chunk;
        while !rest.is_empty() {
            let (text, ends_line) = match rest.iter().position(|byte| *byte == b'\n') {
                Some(at) => (&rest[..at], true),
                None => (rest, false),
            };
            rest = &rest[text.len() + usize::from(ends_line)..];
            let in_window = line >= window.first && window.last.is_none_or(|last| line <= last);
            if in_window && !truncated {
                let keep = text.len().min(LINE_CAP_BYTES.saturating_sub(line_bytes));
                kept.extend_from_slice(&text[..keep]);
                if line_bytes <= LINE_CAP_BYTES && line_bytes + text.len() > LINE_CAP_BYTES {
                    cuts.push((kept.len(), line));
                }
                if ends_line {
                    kept.push(b'\n');
                }
                if kept.len() > READ_CAP_BYTES {
                    // This line does not fit: it goes, and the window ends before it.
                    kept.truncate(line_start);
                    cuts.retain(|(at, _)| *at < line_start);
                    truncated = true;
                } else if ends_line {
                    last_line = line;
                }
            }
            line_bytes += text.len();
            if ends_line {
                line += 1;
                line_bytes = 0;
                line_start = kept.len();
            }
        }
    }
    let total_lines = eof.then(|| if line_bytes > 0 { line } else { line - 1 });
    if eof && line_bytes > 0 && !truncated && line >= window.first && window.last.is_none_or(|last| line <= last) {
        // The last line has no newline.
        last_line = line;
    }
    if !eof && !truncated && line_bytes > LINE_CAP_BYTES && window.last == Some(line) {
        // Stopped inside the window's last line, which was cut: it is shown as far as it goes.
        last_line = line;
    }
    Ok(WindowRead {
        kept,
        cuts,
        sha256: hasher.filter(|_| eof).map(|hasher| hex::encode(hasher.finalize())),
        total_lines,
        last_line,
        truncated,
    })
}

/// The SHA-256 of the regular file `path`, read [`CHUNK_BYTES`] at a time; `None` when it does
/// not exist. Refuses a file over [`DIGEST_CAP_BYTES`].
fn file_sha256(path: &Path, shown: &str, cancel: &Cancel) -> Result<Option<String>, String> {
    match fs::symlink_metadata(path) {
        Err(err) if err.kind() == ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(format!("{shown}: {err}")),
        Ok(_) => {}
    }
    let (mut file, metadata) = open_regular(path, shown)?;
    if metadata.len() > DIGEST_CAP_BYTES {
        return Err(format!(
            "{shown}: is {} bytes, over the {DIGEST_CAP_BYTES}-byte bound for a digest check; omit expected_sha256 to \
             replace it anyway",
            metadata.len()
        ));
    }
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; CHUNK_BYTES];
    let mut read_bytes = 0u64;
    loop {
        if cancel.abandoned() {
            return Err(format!("{shown}: {ABANDONED}"));
        }
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(err) if err.kind() == ErrorKind::Interrupted => continue,
            Err(err) => return Err(format!("{shown}: {err}")),
        };
        read_bytes += n as u64;
        if read_bytes > DIGEST_CAP_BYTES {
            return Err(format!("{shown}: grew over the {DIGEST_CAP_BYTES}-byte bound for a digest check while read"));
        }
        hasher.update(&buf[..n]);
    }
    Ok(Some(hex::encode(hasher.finalize())))
}

/// `write_file {path, content, expected_sha256?}`: absent `expected_sha256` skips the check,
/// `null` requires that the file does not exist, a digest must match the current file.
pub(super) fn write_file(workdir: &Path, input: &Map<String, Value>, cancel: &Cancel) -> ToolOutcome {
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
    let exists = match fs::symlink_metadata(&path) {
        Ok(metadata) => {
            if metadata.is_dir() {
                return ToolOutcome::error(format!("{shown}: is a directory"));
            }
            if let Err(message) = refuse_irregular(&metadata.file_type(), &shown) {
                return ToolOutcome::error(message);
            }
            true
        }
        Err(err) if err.kind() == ErrorKind::NotFound => false,
        Err(err) => return ToolOutcome::error(format!("{shown}: {err}")),
    };
    if exists && must_not_exist {
        let digest = match file_sha256(&path, &shown, cancel) {
            Ok(Some(digest)) => format!(" (sha256 {digest})"),
            _ => String::new(),
        };
        return ToolOutcome::error(format!(
            "{shown}: already exists{digest}; expected_sha256 null requires a new file"
        ));
    }
    if let Some(expected) = expected {
        match file_sha256(&path, &shown, cancel) {
            Err(message) => return ToolOutcome::error(message),
            Ok(None) => {
                return ToolOutcome::error(format!("{shown}: does not exist, so it cannot match expected_sha256"));
            }
            Ok(Some(digest)) if !digest.eq_ignore_ascii_case(expected) => {
                return ToolOutcome::error(format!(
                    "{shown}: expected_sha256 does not match; the current sha256 is {digest}"
                ));
            }
            Ok(Some(_)) => {}
        }
    }
    if cancel.abandoned() {
        return ToolOutcome::error(format!("{shown}: not written: {ABANDONED}"));
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

/// Temp file beside the target, fsync, rename over it, fsync the directory. Keeps an existing
/// file's permissions.
pub(super) fn replace_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let temp = write_temp(path, bytes)?;
    let renamed = fs::rename(&temp, path);
    if renamed.is_err() {
        let _ = fs::remove_file(&temp);
    }
    renamed?;
    sync_parent(path)
}

/// The first half of [`replace_atomically`]: writes `bytes` to a new temp file beside `path`
/// (creating the parent directories), with an existing `path`'s permissions, synced to disk.
/// Answers the temp file's path; on error nothing is left behind (but created directories).
pub(super) fn write_temp(path: &Path, bytes: &[u8]) -> std::io::Result<std::path::PathBuf> {
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
        file.sync_all()
    })();
    match result {
        Ok(()) => Ok(temp),
        Err(err) => {
            let _ = fs::remove_file(&temp);
            Err(err)
        }
    }
}

/// Syncs the directory holding `path`, so that a rename in it is on disk.
pub(super) fn sync_parent(path: &Path) -> std::io::Result<()> {
    let dir = path.parent().ok_or_else(|| std::io::Error::other("no parent directory"))?;
    fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECTORY | libc::O_NONBLOCK).open(dir)?.sync_all()
}

/// The whole content of the regular file `path`, read [`CHUNK_BYTES`] at a time; refuses a file
/// over `cap` bytes (checked before reading, and again while reading, should it grow).
pub(super) fn read_whole(path: &Path, shown: &str, cap: u64, cancel: &Cancel) -> Result<Vec<u8>, String> {
    let (file, metadata) = open_regular(path, shown)?;
    let too_big = |size: String| format!("{shown}: is {size} bytes, over this tool's bound of {cap} bytes");
    if metadata.len() > cap {
        return Err(too_big(metadata.len().to_string()));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(metadata.len()).unwrap_or(0));
    let mut limited = file.take(cap + 1);
    let mut buf = vec![0u8; CHUNK_BYTES];
    loop {
        if cancel.abandoned() {
            return Err(format!("{shown}: {ABANDONED}"));
        }
        match limited.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => bytes.extend_from_slice(&buf[..n]),
            Err(err) if err.kind() == ErrorKind::Interrupted => {}
            Err(err) => return Err(format!("{shown}: {err}")),
        }
    }
    if bytes.len() as u64 > cap {
        return Err(too_big("more than that".to_owned()));
    }
    Ok(bytes)
}

/// One listed entry: name, type, size. Ordered by name, so that a max-heap of them holds the
/// smallest names.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Entry {
    name: String,
    kind: &'static str,
    size: u64,
}

/// `list_dir {path?}`: the first [`LIST_CAP_ENTRIES`] names in order, found while reading the
/// directory with at most that many entries in memory, however large it is.
pub(super) fn list_dir(workdir: &Path, input: &Map<String, Value>, cancel: &Cancel) -> ToolOutcome {
    let requested = match optional_str(input, "path") {
        Ok(path) => path.unwrap_or("."),
        Err(message) => return ToolOutcome::error(message),
    };
    let path = match resolve_existing(workdir, requested) {
        Ok(path) => path,
        Err(message) => return ToolOutcome::error(message),
    };
    let shown = display(workdir, &path);
    let read = match fs::read_dir(&path) {
        Ok(read) => read,
        Err(err) if err.kind() == ErrorKind::NotADirectory => {
            return ToolOutcome::error(format!("{shown}: is not a directory; use read_file"));
        }
        Err(err) => return ToolOutcome::error(format!("{shown}: {err}")),
    };
    let mut smallest: BinaryHeap<Entry> = BinaryHeap::with_capacity(LIST_CAP_ENTRIES + 1);
    let mut total = 0usize;
    for entry in read.filter_map(Result::ok) {
        if cancel.abandoned() {
            return ToolOutcome::error(format!("{shown}: {ABANDONED}"));
        }
        total += 1;
        let name = entry.file_name().to_string_lossy().into_owned();
        if smallest.len() == LIST_CAP_ENTRIES && smallest.peek().is_some_and(|largest| name >= largest.name) {
            continue;
        }
        let metadata = entry.metadata().ok();
        let kind = match metadata.as_ref().map(fs::Metadata::file_type) {
            Some(t) if t.is_symlink() => "symlink",
            Some(t) if t.is_dir() => "dir",
            Some(t) if t.is_file() => "file",
            _ => "other",
        };
        smallest.push(Entry { name, kind, size: metadata.map_or(0, |m| m.len()) });
        if smallest.len() > LIST_CAP_ENTRIES {
            smallest.pop();
        }
    }
    let entries = smallest.into_sorted_vec();
    let truncated = total > LIST_CAP_ENTRIES;
    let mut content = format!("path: {shown}\n");
    for Entry { name, kind, size } in &entries {
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
        entries.iter().map(|Entry { name, kind, size }| json!({ "name": name, "type": kind, "size": size })).collect();
    ToolOutcome::Completed {
        content,
        structured_content: json!({ "path": shown, "entries": listed, "truncated": truncated }),
        is_error: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_file(workdir: &Path, input: &Map<String, Value>) -> ToolOutcome {
        super::read_file(workdir, input, &Cancel::never())
    }

    fn write_file(workdir: &Path, input: &Map<String, Value>) -> ToolOutcome {
        super::write_file(workdir, input, &Cancel::never())
    }

    fn list_dir(workdir: &Path, input: &Map<String, Value>) -> ToolOutcome {
        super::list_dir(workdir, input, &Cancel::never())
    }

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
        outcome.into_parts()
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

    /// Makes a FIFO at `path` with mkfifo(1) (no unsafe code here).
    fn mkfifo(path: &Path) {
        let status = std::process::Command::new("mkfifo").arg(path).status().unwrap();
        assert!(status.success());
    }

    #[test]
    fn file_tools_refuse_fifos_sockets_and_devices_without_blocking() {
        let (_root, workdir) = workdir();
        mkfifo(&workdir.join("pipe"));
        let _socket = std::os::unix::net::UnixListener::bind(workdir.join("sock")).unwrap();
        // A FIFO's open blocks until a writer comes; none ever does, so a hang fails the test.
        for (path, what) in [("pipe", "is a FIFO"), ("sock", "is a socket")] {
            let (content, _, is_error) = completed(read_file(&workdir, &input(json!({"path": path, "limit": 1}))));
            assert!(is_error, "{path}");
            assert!(content.contains(what), "{path}: {content}");
            let (content, _, is_error) = completed(write_file(
                &workdir,
                &input(json!({"path": path, "content": "x", "expected_sha256": sha("")})),
            ));
            assert!(is_error, "{path}");
            assert!(content.contains(what), "{path}: {content}");
            let (content, _, is_error) = completed(write_file(&workdir, &input(json!({"path": path, "content": "x"}))));
            assert!(is_error && content.contains(what), "{path}: {content}");
        }
        assert!(fs::symlink_metadata(workdir.join("pipe")).unwrap().file_type().is_fifo(), "the FIFO is untouched");
        // A device is refused by its type, before any open.
        let err = open_regular(Path::new("/dev/null"), "null").unwrap_err();
        assert!(err.contains("is a device"), "{err}");
    }

    /// Serves `remaining` bytes of `byte` and counts what it served: a file of any size, costing
    /// no memory and no disk.
    struct Endless {
        byte: u8,
        remaining: u64,
        served: u64,
    }

    impl Read for Endless {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = buf.len().min(usize::try_from(self.remaining).unwrap_or(usize::MAX));
            buf[..n].fill(self.byte);
            self.remaining -= n as u64;
            self.served += n as u64;
            Ok(n)
        }
    }

    #[test]
    fn a_long_line_is_cut_while_read_and_reading_stops_at_the_window() {
        // 8 GiB without a newline, first line only: at most a few chunks are ever read.
        let mut endless = Endless { byte: b'x', remaining: 8 << 30, served: 0 };
        let window = Window { first: 1, last: Some(1) };
        let read = read_window(&mut endless, window, false, &Cancel::never()).unwrap();
        assert!(endless.served <= (LINE_CAP_BYTES + 2 * CHUNK_BYTES) as u64, "served {} bytes", endless.served);
        assert_eq!(read.kept.len(), LINE_CAP_BYTES);
        assert_eq!(read.cuts, [(LINE_CAP_BYTES, 1)]);
        assert_eq!((read.last_line, read.total_lines, read.sha256.as_deref()), (1, None, None));
        assert!(read.marked_text().ends_with(&format!("x [line 1 cut after {LINE_CAP_BYTES} bytes]")));

        // Digested to the end (a file under the digest bound): still only a line's head in memory.
        let size = 3 * LINE_CAP_BYTES as u64;
        let mut long = Endless { byte: b'y', remaining: size, served: 0 }.chain(&b"\nshort\n"[..]);
        let read = read_window(&mut long, Window { first: 1, last: None }, true, &Cancel::never()).unwrap();
        assert_eq!(read.total_lines, Some(2));
        assert_eq!(read.last_line, 2);
        assert_eq!(read.kept.len(), LINE_CAP_BYTES + "\nshort\n".len());
        let mut hasher = Sha256::new();
        hasher.update(vec![b'y'; usize::try_from(size).unwrap()]);
        hasher.update(b"\nshort\n");
        assert_eq!(read.sha256, Some(hex::encode(hasher.finalize())));
        assert_eq!(
            read.marked_text(),
            format!("{} [line 1 cut after {LINE_CAP_BYTES} bytes]\nshort\n", "y".repeat(LINE_CAP_BYTES))
        );

        // An abandoned call stops at its next chunk.
        let cancel = Cancel::never();
        cancel.abandon_for_test();
        let mut endless = Endless { byte: b'z', remaining: 8 << 30, served: 0 };
        assert!(read_window(&mut endless, Window { first: 1, last: None }, true, &cancel).is_err());
        assert_eq!(endless.served, 0);
    }

    #[test]
    fn read_file_on_a_huge_sparse_file_keeps_a_line_head_and_skips_the_digest() {
        let (_root, workdir) = workdir();
        let file = fs::File::create(workdir.join("huge.bin")).unwrap();
        let size = 3u64 << 30;
        file.set_len(size).unwrap();
        let (content, structured, is_error) =
            completed(read_file(&workdir, &input(json!({"path": "huge.bin", "limit": 1}))));
        assert!(!is_error, "{content}");
        assert_eq!(structured["size"], size);
        assert_eq!(structured["sha256"], Value::Null);
        assert_eq!(structured["total_lines"], Value::Null);
        assert_eq!(structured["cut_lines"], json!([1]));
        assert_eq!(structured["content"].as_str().unwrap().len(), LINE_CAP_BYTES);
        assert!(content.contains("lines: 1-1 of ?"), "{}", &content[..200]);
        assert!(content.ends_with(&format!(" [line 1 cut after {LINE_CAP_BYTES} bytes]")));
        assert!(content.contains(&format!("the file is {size} bytes, over the {DIGEST_CAP_BYTES}-byte bound")));

        // write_file will not digest it either, and says how to go on.
        let (content, _, is_error) = completed(write_file(
            &workdir,
            &input(json!({"path": "huge.bin", "content": "x", "expected_sha256": sha("")})),
        ));
        assert!(is_error);
        assert!(content.contains("omit expected_sha256"), "{content}");
        assert_eq!(fs::metadata(workdir.join("huge.bin")).unwrap().len(), size, "untouched");
    }

    #[test]
    fn list_dir_keeps_the_first_names_of_a_large_directory() {
        let (_root, workdir) = workdir();
        let total = LIST_CAP_ENTRIES + 50;
        // Created in reverse, so that the directory's own order is not the sorted one.
        for n in (0..total).rev() {
            fs::write(workdir.join(format!("f{n:05}")), "").unwrap();
        }
        let (content, structured, _) = completed(list_dir(&workdir, &input(json!({}))));
        let names: Vec<&str> =
            structured["entries"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
        let expected: Vec<String> = (0..LIST_CAP_ENTRIES).map(|n| format!("f{n:05}")).collect();
        assert_eq!(names, expected);
        assert_eq!(structured["truncated"], true);
        assert!(content.ends_with(&format!("[showing the first {LIST_CAP_ENTRIES} of {total} entries]\n")));
    }
}
