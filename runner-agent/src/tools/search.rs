//! `grep {pattern, path?, glob?, case_insensitive?, max_results?}` and
//! `glob {pattern, path?, max_results?}`: search contents and names under the workdir.
//!
//! Both walk with `ignore` (ripgrep's walker): `.gitignore` (in or out of a git repository),
//! `.ignore` and git's exclude files are honoured, hidden files and directories (a leading `.`)
//! are skipped, symlinks are not followed (so the walk never leaves the workdir), and each
//! directory is read in name order, so the results come in a fixed order: depth first, by name,
//! and within a file by line. Contents are searched with `grep-searcher` and a `grep-regex`
//! matcher (Rust regex syntax), line by line; a file with a NUL byte is binary and skipped, and
//! so is a file over [`MAX_SEARCHED_FILE_BYTES`]. Names are matched with `globset`.
//!
//! Bounds: at most `max_results` results (default [`DEFAULT_RESULTS`], at most [`MAX_RESULTS`]),
//! each shown line cut at [`LINE_CHARS`] characters, at most [`MAX_OUTPUT_BYTES`] of result text;
//! a line longer than [`LINE_HEAP_BYTES`] makes its file skipped (counted as unreadable). The
//! answer says when it was cut.

use std::fmt::Write as _;
use std::io;
use std::path::Path;

use globset::{GlobBuilder, GlobMatcher};
use grep_regex::RegexMatcherBuilder;
use grep_searcher::{BinaryDetection, Searcher, SearcherBuilder, Sink, SinkFinish, SinkMatch};
use ignore::WalkBuilder;
use serde_json::{Map, Value, json};

use super::ToolOutcome;
use super::args::{optional_bool, optional_positive, optional_str, required_str};
use super::blocking::Cancel;
use super::files::ABANDONED;
use super::paths::{display, resolve_existing};

/// Results returned when `max_results` is not given.
pub(super) const DEFAULT_RESULTS: usize = 200;
/// The most results one call returns.
pub(super) const MAX_RESULTS: usize = 2_000;
/// A shown line keeps at most this many characters.
pub(super) const LINE_CHARS: usize = 500;
/// The result text (paths and lines) stops growing past this many bytes.
pub(super) const MAX_OUTPUT_BYTES: usize = 256 * 1024;
/// grep skips files larger than this (64 MiB).
pub(super) const MAX_SEARCHED_FILE_BYTES: u64 = 64 * 1024 * 1024;
/// grep holds at most this much of one line; a file with a longer line is skipped.
pub(super) const LINE_HEAP_BYTES: usize = 2 * 1024 * 1024;
/// The compiled regex may take at most this much memory.
const REGEX_SIZE_LIMIT: usize = 16 * 1024 * 1024;

/// The arguments both tools share.
struct Scope<'a> {
    root: std::path::PathBuf,
    shown_root: String,
    pattern: &'a str,
    limit: usize,
    /// `max_results` was above [`MAX_RESULTS`] and was lowered to it.
    clamped: bool,
}

fn scope<'a>(workdir: &Path, input: &'a Map<String, Value>) -> Result<Scope<'a>, String> {
    let pattern = required_str(input, "pattern")?;
    if pattern.is_empty() {
        return Err("`pattern` must not be empty".to_owned());
    }
    let requested = optional_str(input, "path")?.unwrap_or(".");
    let asked = optional_positive(input, "max_results")?;
    let root = resolve_existing(workdir, requested)?;
    let shown_root = display(workdir, &root);
    let asked = asked.map_or(DEFAULT_RESULTS, |n| usize::try_from(n).unwrap_or(usize::MAX));
    Ok(Scope { root, shown_root, pattern, limit: asked.min(MAX_RESULTS), clamped: asked > MAX_RESULTS })
}

/// The walk both tools use: ignore files honoured, hidden entries skipped, links not followed,
/// each directory read in name order.
fn walker(root: &Path) -> ignore::Walk {
    WalkBuilder::new(root)
        .follow_links(false)
        .require_git(false)
        .hidden(true)
        .sort_by_file_name(|a, b| a.cmp(b))
        .build()
}

/// A glob for names: with no `/` it matches an entry's file name, else its path relative to the
/// searched directory; `*` never crosses a `/`, `**` does.
struct NameGlob {
    matcher: GlobMatcher,
    whole_path: bool,
}

impl NameGlob {
    fn new(pattern: &str, field: &str) -> Result<NameGlob, String> {
        let glob = GlobBuilder::new(pattern)
            .literal_separator(true)
            .build()
            .map_err(|err| format!("`{field}` is not a valid glob: {err}"))?;
        Ok(NameGlob { matcher: glob.compile_matcher(), whole_path: pattern.contains('/') })
    }

    fn matches(&self, relative: &Path) -> bool {
        if self.whole_path {
            self.matcher.is_match(relative)
        } else {
            relative.file_name().is_some_and(|name| self.matcher.is_match(name))
        }
    }
}

/// `text` without its line terminator, cut to [`LINE_CHARS`] characters.
fn shown_line(bytes: &[u8]) -> (String, bool) {
    let text = String::from_utf8_lossy(bytes);
    let text = text.trim_end_matches(['\n', '\r']);
    match text.char_indices().nth(LINE_CHARS) {
        Some((cut, _)) => (text[..cut].to_owned(), true),
        None => (text.to_owned(), false),
    }
}

/// One file's matches, kept until the search of the file ends: a file found binary part way is
/// dropped with the matches it had.
struct FileMatches {
    lines: Vec<(u64, String, bool)>,
    budget: usize,
    binary: bool,
}

impl Sink for FileMatches {
    type Error = io::Error;

    fn matched(&mut self, _searcher: &Searcher, mat: &SinkMatch<'_>) -> Result<bool, io::Error> {
        let (text, cut) = shown_line(mat.bytes());
        self.lines.push((mat.line_number().unwrap_or(0), text, cut));
        Ok(self.lines.len() < self.budget)
    }

    fn binary_data(&mut self, _searcher: &Searcher, _offset: u64) -> Result<bool, io::Error> {
        self.binary = true;
        Ok(false)
    }

    fn finish(&mut self, _searcher: &Searcher, finish: &SinkFinish) -> Result<(), io::Error> {
        self.binary |= finish.binary_byte_offset().is_some();
        Ok(())
    }
}

/// Why a search stopped before the walk ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cut {
    Results,
    Bytes,
}

/// `grep`: see the module's page.
pub(super) fn grep(workdir: &Path, input: &Map<String, Value>, cancel: &Cancel) -> ToolOutcome {
    let parsed = scope(workdir, input).and_then(|scope| {
        let glob = optional_str(input, "glob")?.map(|glob| NameGlob::new(glob, "glob")).transpose()?;
        Ok((scope, glob, optional_bool(input, "case_insensitive")?.unwrap_or(false)))
    });
    let (scope, glob, case_insensitive) = match parsed {
        Ok(parsed) => parsed,
        Err(message) => return ToolOutcome::error(message),
    };
    let matcher = match RegexMatcherBuilder::new()
        .case_insensitive(case_insensitive)
        .size_limit(REGEX_SIZE_LIMIT)
        .dfa_size_limit(REGEX_SIZE_LIMIT)
        .line_terminator(Some(b'\n'))
        .build(scope.pattern)
    {
        Ok(matcher) => matcher,
        Err(err) => return ToolOutcome::error(format!("`pattern` is not a valid regex: {err}")),
    };
    let mut searcher = SearcherBuilder::new()
        .line_number(true)
        .binary_detection(BinaryDetection::quit(0))
        .heap_limit(Some(LINE_HEAP_BYTES))
        .build();
    let mut matches: Vec<Value> = Vec::new();
    let mut text = String::new();
    let (mut files_searched, mut skipped_binary, mut skipped_large, mut unreadable) = (0u64, 0u64, 0u64, 0u64);
    let mut cut = None;
    for entry in walker(&scope.root) {
        if cancel.abandoned() {
            return ToolOutcome::error(format!("grep: {ABANDONED}"));
        }
        let Ok(entry) = entry else {
            unreadable += 1;
            continue;
        };
        if !entry.file_type().is_some_and(|kind| kind.is_file()) {
            continue;
        }
        let path = entry.path();
        let relative = path.strip_prefix(&scope.root).unwrap_or(path);
        if glob.as_ref().is_some_and(|glob| !glob.matches(relative)) {
            continue;
        }
        if entry.metadata().is_ok_and(|metadata| metadata.len() > MAX_SEARCHED_FILE_BYTES) {
            skipped_large += 1;
            continue;
        }
        files_searched += 1;
        let mut found = FileMatches { lines: Vec::new(), budget: scope.limit - matches.len(), binary: false };
        if searcher.search_path(&matcher, path, &mut found).is_err() {
            unreadable += 1;
            continue;
        }
        if found.binary {
            skipped_binary += 1;
            continue;
        }
        let shown = display(workdir, path);
        for (line, line_text, line_cut) in found.lines {
            if text.len() >= MAX_OUTPUT_BYTES {
                cut = Some(Cut::Bytes);
                break;
            }
            let mark = if line_cut { " [line cut]" } else { "" };
            let _ = writeln!(text, "{shown}:{line}: {line_text}{mark}");
            matches.push(json!({ "path": shown, "line": line, "text": line_text, "cut": line_cut }));
        }
        if cut.is_none() && matches.len() >= scope.limit {
            cut = Some(Cut::Results);
        }
        if cut.is_some() {
            break;
        }
    }
    let mut content = if matches.is_empty() {
        format!("no match for {:?} under {}\n", scope.pattern, scope.shown_root)
    } else {
        text
    };
    push_cut_note(&mut content, cut, matches.len(), scope.clamped);
    for (count, what) in [
        (skipped_binary, "binary files"),
        (skipped_large, "files over 64 MiB"),
        (unreadable, "entries that could not be read (or had a line over 2 MiB)"),
    ] {
        if count > 0 {
            let _ = writeln!(content, "[skipped {count} {what}]");
        }
    }
    ToolOutcome::Completed {
        content,
        structured_content: json!({
            "matches": matches,
            "truncated": cut.is_some(),
            "files_searched": files_searched,
            "skipped_binary": skipped_binary,
            "skipped_large": skipped_large,
            "unreadable": unreadable,
        }),
        is_error: false,
    }
}

/// `glob`: see the module's page.
pub(super) fn glob(workdir: &Path, input: &Map<String, Value>, cancel: &Cancel) -> ToolOutcome {
    let parsed = scope(workdir, input).and_then(|scope| Ok((NameGlob::new(scope.pattern, "pattern")?, scope)));
    let (glob, scope) = match parsed {
        Ok(parsed) => parsed,
        Err(message) => return ToolOutcome::error(message),
    };
    let mut found: Vec<Value> = Vec::new();
    let mut text = String::new();
    let mut cut = None;
    for entry in walker(&scope.root).filter_map(Result::ok) {
        if cancel.abandoned() {
            return ToolOutcome::error(format!("glob: {ABANDONED}"));
        }
        let path = entry.path();
        let relative = path.strip_prefix(&scope.root).unwrap_or(path);
        if relative.as_os_str().is_empty() || !glob.matches(relative) {
            continue;
        }
        if found.len() >= scope.limit {
            cut = Some(Cut::Results);
            break;
        }
        if text.len() >= MAX_OUTPUT_BYTES {
            cut = Some(Cut::Bytes);
            break;
        }
        let kind = match entry.file_type() {
            Some(kind) if kind.is_dir() => "dir",
            Some(kind) if kind.is_symlink() => "symlink",
            Some(kind) if kind.is_file() => "file",
            _ => "other",
        };
        let shown = display(workdir, path);
        let slash = if kind == "dir" { "/" } else { "" };
        let _ = writeln!(text, "{shown}{slash}");
        found.push(json!({ "path": shown, "type": kind }));
    }
    let mut content = if found.is_empty() {
        format!("nothing matches {:?} under {}\n", scope.pattern, scope.shown_root)
    } else {
        text
    };
    push_cut_note(&mut content, cut, found.len(), scope.clamped);
    ToolOutcome::Completed {
        content,
        structured_content: json!({ "paths": found, "truncated": cut.is_some() }),
        is_error: false,
    }
}

fn push_cut_note(content: &mut String, cut: Option<Cut>, shown: usize, clamped: bool) {
    match cut {
        Some(Cut::Results) => {
            let _ = writeln!(content, "[cut after {shown} results; narrow the search or raise max_results]");
        }
        Some(Cut::Bytes) => {
            let _ = writeln!(content, "[cut after {shown} results: the result text reached {MAX_OUTPUT_BYTES} bytes]");
        }
        None => {}
    }
    if clamped {
        let _ = writeln!(content, "[max_results is at most {MAX_RESULTS}]");
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    use crate::tools::test_workdir as workdir;

    fn run(
        tool: fn(&Path, &Map<String, Value>, &Cancel) -> ToolOutcome,
        workdir: &Path,
        input: Value,
    ) -> (String, Value, bool) {
        tool(workdir, input.as_object().unwrap(), &Cancel::never()).into_parts()
    }

    /// A small tree: sources, an ignored build dir, a hidden dir, a binary file, a link out.
    fn tree(workdir: &Path, outside: &Path) {
        fs::create_dir_all(workdir.join("src/deep")).unwrap();
        fs::create_dir_all(workdir.join("target")).unwrap();
        fs::create_dir_all(workdir.join(".hidden")).unwrap();
        fs::write(workdir.join(".gitignore"), "target/\n*.log\n").unwrap();
        fs::write(workdir.join("src/b.rs"), "fn beta() {}\n// TODO: beta\n").unwrap();
        fs::write(workdir.join("src/a.rs"), "fn alpha() {}\n// todo lower\n// TODO: alpha\n").unwrap();
        fs::write(workdir.join("src/deep/c.txt"), "TODO deep\n").unwrap();
        fs::write(workdir.join("target/out.rs"), "TODO ignored\n").unwrap();
        fs::write(workdir.join("run.log"), "TODO ignored\n").unwrap();
        fs::write(workdir.join(".hidden/h.rs"), "TODO hidden\n").unwrap();
        fs::write(workdir.join("blob.bin"), b"TODO\0binary\n").unwrap();
        fs::write(outside.join("secret.rs"), "TODO outside\n").unwrap();
        std::os::unix::fs::symlink(outside, workdir.join("out")).unwrap();
    }

    #[test]
    fn grep_finds_lines_in_order_honouring_gitignore_and_skipping_binaries() {
        let (_dir, workdir) = workdir();
        let outside = tempfile::tempdir().unwrap();
        tree(&workdir, outside.path());
        let (content, structured, is_error) = run(grep, &workdir, json!({"pattern": "TODO"}));
        assert!(!is_error);
        let found: Vec<String> = structured["matches"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| format!("{}:{}", m["path"].as_str().unwrap(), m["line"]))
            .collect();
        assert_eq!(found, ["src/a.rs:3", "src/b.rs:2", "src/deep/c.txt:1"], "{content}");
        assert_eq!(structured["skipped_binary"], 1);
        assert_eq!(structured["truncated"], false);
        assert!(content.starts_with("src/a.rs:3: // TODO: alpha\n"), "{content}");
        assert!(content.contains("[skipped 1 binary files]"), "{content}");

        let (_, structured, _) =
            run(grep, &workdir, json!({"pattern": "todo", "case_insensitive": true, "glob": "*.rs"}));
        assert_eq!(structured["matches"].as_array().unwrap().len(), 3);
        let (_, structured, _) = run(grep, &workdir, json!({"pattern": "TODO", "path": "src/deep"}));
        assert_eq!(structured["matches"][0]["path"], "src/deep/c.txt");
        let (content, structured, is_error) = run(grep, &workdir, json!({"pattern": "nothing-like-this"}));
        assert!(!is_error && content.starts_with("no match"));
        assert_eq!(structured["matches"], json!([]));
    }

    #[test]
    fn grep_bounds_results_and_lines_and_refuses_bad_input() {
        let (_dir, workdir) = workdir();
        let long = "x".repeat(LINE_CHARS + 50);
        fs::write(workdir.join("many.txt"), format!("{long}\n").repeat(30)).unwrap();
        let (content, structured, _) = run(grep, &workdir, json!({"pattern": "x", "max_results": 10}));
        let matches = structured["matches"].as_array().unwrap();
        assert_eq!(matches.len(), 10);
        assert_eq!(matches[0]["text"].as_str().unwrap().chars().count(), LINE_CHARS);
        assert_eq!(matches[0]["cut"], true);
        assert_eq!(structured["truncated"], true);
        assert!(content.contains("[cut after 10 results"), "{content}");
        let (content, structured, _) = run(grep, &workdir, json!({"pattern": "x", "max_results": 5000}));
        assert_eq!(structured["matches"].as_array().unwrap().len(), 30);
        assert!(content.contains("[max_results is at most 2000]"));

        for (input, problem) in [
            (json!({"pattern": "("}), "not a valid regex"),
            (json!({"pattern": "x", "path": "../"}), "escapes the working directory"),
            (json!({"pattern": "x", "glob": "[" }), "not a valid glob"),
            (json!({"pattern": ""}), "must not be empty"),
            (json!({"pattern": "x", "max_results": 0}), "positive integer"),
        ] {
            let (content, _, is_error) = run(grep, &workdir, input.clone());
            assert!(is_error, "{input}");
            assert!(content.contains(problem), "{input}: {content}");
        }
    }

    #[test]
    fn glob_matches_names_and_paths_in_order_inside_the_workdir() {
        let (_dir, workdir) = workdir();
        let outside = tempfile::tempdir().unwrap();
        tree(&workdir, outside.path());
        let (content, structured, is_error) = run(glob, &workdir, json!({"pattern": "*.rs"}));
        assert!(!is_error);
        let paths: Vec<&str> =
            structured["paths"].as_array().unwrap().iter().map(|p| p["path"].as_str().unwrap()).collect();
        assert_eq!(paths, ["src/a.rs", "src/b.rs"], "ignored, hidden and linked-out files stay out: {content}");
        let (_, structured, _) = run(glob, &workdir, json!({"pattern": "src/*"}));
        let paths: Vec<&str> =
            structured["paths"].as_array().unwrap().iter().map(|p| p["path"].as_str().unwrap()).collect();
        assert_eq!(paths, ["src/a.rs", "src/b.rs", "src/deep"], "`*` does not cross `/`");
        assert_eq!(structured["paths"][2]["type"], "dir");
        let (_, structured, _) = run(glob, &workdir, json!({"pattern": "**/*.txt"}));
        assert_eq!(structured["paths"], json!([{"path": "src/deep/c.txt", "type": "file"}]));
        let (content, structured, _) = run(glob, &workdir, json!({"pattern": "*", "max_results": 2}));
        assert_eq!(structured["paths"].as_array().unwrap().len(), 2);
        assert_eq!(structured["truncated"], true);
        assert!(content.contains("[cut after 2 results"), "{content}");
        let (content, _, is_error) = run(glob, &workdir, json!({"pattern": "*.rs", "path": "/etc"}));
        assert!(is_error && content.contains("escapes the working directory"), "{content}");
        let (content, _, is_error) = run(glob, &workdir, json!({"pattern": "*.nothing"}));
        assert!(!is_error && content.starts_with("nothing matches"), "{content}");
    }
}
