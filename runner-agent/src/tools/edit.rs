//! `edit {path, old_text, new_text, expected_sha256?, replace_all?}`: replace an exact text in one
//! UTF-8 file inside the workdir, atomically (write_file's temp file and rename).
//!
//! The file is read whole, so it is bounded by [`EDIT_CAP_BYTES`], and so is the edited text. It
//! refuses, touching nothing, when `old_text` is absent, or appears more than once without
//! `replace_all` (the answer says how many times, and on which lines), or when `expected_sha256`
//! does not match the file as read.

use std::path::Path;

use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use super::ToolOutcome;
use super::args::{optional_bool, optional_str, required_str};
use super::blocking::Cancel;
use super::files::{ABANDONED, read_whole, replace_atomically};
use super::paths::{display, resolve_existing};

/// The largest file edit reads, and the largest text it writes, in bytes (16 MiB).
pub(super) const EDIT_CAP_BYTES: u64 = 16 * 1024 * 1024;
/// The lines of at most this many occurrences are named in an answer.
const LINES_SHOWN: usize = 20;

/// `edit`: see the module's page.
pub(super) fn edit(workdir: &Path, input: &Map<String, Value>, cancel: &Cancel) -> ToolOutcome {
    let parsed = (|| {
        Ok::<_, String>((
            required_str(input, "path")?,
            required_str(input, "old_text")?,
            required_str(input, "new_text")?,
            optional_str(input, "expected_sha256")?,
            optional_bool(input, "replace_all")?.unwrap_or(false),
        ))
    })();
    let (requested, old_text, new_text, expected, replace_all) = match parsed {
        Ok(parsed) => parsed,
        Err(message) => return ToolOutcome::error(message),
    };
    if matches!(input.get("expected_sha256"), Some(Value::Null)) {
        return ToolOutcome::error(
            "expected_sha256 null means a new file; edit changes existing files, use write_file",
        );
    }
    if old_text.is_empty() {
        return ToolOutcome::error("`old_text` must not be empty; use write_file to write a whole file");
    }
    if old_text == new_text {
        return ToolOutcome::error("`old_text` and `new_text` are the same; there is nothing to change");
    }
    let path = match resolve_existing(workdir, requested) {
        Ok(path) => path,
        Err(message) => return ToolOutcome::error(message),
    };
    let shown = display(workdir, &path);
    let bytes = match read_whole(&path, &shown, EDIT_CAP_BYTES, cancel) {
        Ok(bytes) => bytes,
        Err(message) => return ToolOutcome::error(message),
    };
    let digest = hex::encode(Sha256::digest(&bytes));
    if let Some(expected) = expected
        && !digest.eq_ignore_ascii_case(expected)
    {
        return ToolOutcome::error(format!("{shown}: expected_sha256 does not match; the current sha256 is {digest}"));
    }
    let Ok(text) = String::from_utf8(bytes) else {
        return ToolOutcome::error(format!("{shown}: is not UTF-8 text; edit changes text files only"));
    };
    let at: Vec<usize> = text.match_indices(old_text).map(|(at, _)| at).collect();
    let lines = lines_of(&text, &at);
    match at.len() {
        0 => return ToolOutcome::error(format!("{shown}: old_text was not found; the file is unchanged")),
        1 => {}
        n if !replace_all => {
            return ToolOutcome::error(format!(
                "{shown}: old_text appears {n} times (at lines {lines}); add surrounding text to make it unique, \
                 or set replace_all; the file is unchanged"
            ));
        }
        _ => {}
    }
    let grown = (new_text.len() as u64).saturating_sub(old_text.len() as u64) * at.len() as u64;
    if text.len() as u64 + grown > EDIT_CAP_BYTES {
        return ToolOutcome::error(format!(
            "{shown}: the edited file would be over this tool's bound of {EDIT_CAP_BYTES} bytes; the file is unchanged"
        ));
    }
    let edited = text.replace(old_text, new_text);
    if cancel.abandoned() {
        return ToolOutcome::error(format!("{shown}: not written: {ABANDONED}"));
    }
    if let Err(err) = replace_atomically(&path, edited.as_bytes()) {
        return ToolOutcome::error(format!("{shown}: {err}; the file is unchanged"));
    }
    let new_digest = hex::encode(Sha256::digest(edited.as_bytes()));
    let replacements = at.len();
    let plural = if replacements == 1 { "" } else { "s" };
    ToolOutcome::Completed {
        content: format!(
            "edited {shown}: {replacements} replacement{plural} (at lines {lines}); sha256 {new_digest}, {} bytes",
            edited.len()
        ),
        structured_content: json!({
            "path": shown,
            "sha256": new_digest,
            "previous_sha256": digest,
            "replacements": replacements,
            "bytes": edited.len(),
        }),
        is_error: false,
    }
}

/// The 1-based lines of the byte offsets `at` (ascending) in `text`, the first [`LINES_SHOWN`]
/// of them, comma-separated.
fn lines_of(text: &str, at: &[usize]) -> String {
    let mut shown = Vec::new();
    let mut line = 1;
    let mut from = 0;
    for offset in at.iter().take(LINES_SHOWN) {
        line += text.as_bytes()[from..*offset].iter().filter(|byte| **byte == b'\n').count();
        from = *offset;
        shown.push(line.to_string());
    }
    let mut lines = shown.join(", ");
    if at.len() > LINES_SHOWN {
        lines.push_str(&format!(", and {} more", at.len() - LINES_SHOWN));
    }
    lines
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    use crate::tools::test_workdir as workdir;

    fn run(workdir: &Path, input: Value) -> (String, Value, bool) {
        edit(workdir, input.as_object().unwrap(), &Cancel::never()).into_parts()
    }

    fn sha(text: &str) -> String {
        hex::encode(Sha256::digest(text.as_bytes()))
    }

    #[test]
    fn edit_replaces_a_unique_text_atomically_and_reports_the_new_digest() {
        let (_dir, workdir) = workdir();
        let before = "fn main() {\n    println!(\"hi\");\n}\n";
        fs::write(workdir.join("main.rs"), before).unwrap();
        let (content, structured, is_error) = run(
            &workdir,
            json!({"path": "main.rs", "old_text": "\"hi\"", "new_text": "\"hello\"", "expected_sha256": sha(before)}),
        );
        assert!(!is_error, "{content}");
        let after = "fn main() {\n    println!(\"hello\");\n}\n";
        assert_eq!(fs::read_to_string(workdir.join("main.rs")).unwrap(), after);
        assert_eq!(structured["sha256"], sha(after));
        assert_eq!(structured["previous_sha256"], sha(before));
        assert_eq!(structured["replacements"], 1);
        assert!(content.contains("at lines 2"), "{content}");
        let names: Vec<String> =
            fs::read_dir(&workdir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        assert_eq!(names, ["main.rs"], "no temp file is left");
    }

    #[test]
    fn edit_refuses_absent_ambiguous_and_stale_edits_and_touches_nothing() {
        let (_dir, workdir) = workdir();
        let text = "a = 1\nb = 1\nc = 1\n";
        fs::write(workdir.join("f.txt"), text).unwrap();
        let (content, _, is_error) = run(&workdir, json!({"path": "f.txt", "old_text": "d = 1", "new_text": "d = 2"}));
        assert!(is_error);
        assert!(content.contains("not found"), "{content}");
        let (content, _, is_error) = run(&workdir, json!({"path": "f.txt", "old_text": "= 1", "new_text": "= 2"}));
        assert!(is_error);
        assert!(content.contains("appears 3 times (at lines 1, 2, 3)"), "{content}");
        let (content, _, is_error) = run(
            &workdir,
            json!({"path": "f.txt", "old_text": "a = 1", "new_text": "a = 2", "expected_sha256": sha("other")}),
        );
        assert!(is_error);
        assert!(content.contains(&format!("the current sha256 is {}", sha(text))), "{content}");
        let (_, _, is_error) =
            run(&workdir, json!({"path": "f.txt", "old_text": "a", "new_text": "b", "expected_sha256": null}));
        assert!(is_error);
        let (content, _, is_error) = run(&workdir, json!({"path": "f.txt", "old_text": "", "new_text": "x"}));
        assert!(is_error && content.contains("must not be empty"), "{content}");
        let (content, _, is_error) = run(&workdir, json!({"path": "../f.txt", "old_text": "a", "new_text": "b"}));
        assert!(is_error && content.contains("escapes the working directory"), "{content}");
        let (content, _, is_error) = run(&workdir, json!({"path": "missing.txt", "old_text": "a", "new_text": "b"}));
        assert!(is_error && content.contains("no such file"), "{content}");
        fs::write(workdir.join("bin"), [0xff, 0xfe, b'a']).unwrap();
        let (content, _, is_error) = run(&workdir, json!({"path": "bin", "old_text": "a", "new_text": "b"}));
        assert!(is_error && content.contains("not UTF-8"), "{content}");
        assert_eq!(fs::read_to_string(workdir.join("f.txt")).unwrap(), text, "every refusal left the file alone");

        let (content, structured, is_error) =
            run(&workdir, json!({"path": "f.txt", "old_text": "= 1", "new_text": "= 2", "replace_all": true}));
        assert!(!is_error, "{content}");
        assert_eq!(structured["replacements"], 3);
        assert_eq!(fs::read_to_string(workdir.join("f.txt")).unwrap(), "a = 2\nb = 2\nc = 2\n");
    }

    #[test]
    fn lines_of_names_at_most_twenty_lines() {
        let text = "x\n".repeat(30);
        let at: Vec<usize> = text.match_indices('x').map(|(at, _)| at).collect();
        let lines = lines_of(&text, &at);
        assert!(lines.starts_with("1, 2, 3,"), "{lines}");
        assert!(lines.ends_with("20, and 10 more"), "{lines}");
    }
}
