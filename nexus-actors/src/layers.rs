//! The server's module groups and the one direction their arrows go (`docs/architecture.md`,
//! "Server modules"), checked over the source: a group's code names only groups below it. The same
//! reading of the source keeps every code comment of the workspace citing documents that exist:
//! a `docs/<file>.md` with, when one is quoted, a heading of that file.

/// The groups, lowest first. A group may use any group before it, never one after it; the crate
/// root (`lib.rs`, `main.rs`) wires them all together.
const LAYERS: [&str; 10] =
    ["json", "clock", "auth", "declaration", "model", "store", "config", "actors", "doors", "cli"];

mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::{Path, PathBuf};

    use super::LAYERS;

    /// `path`'s Rust files, recursively.
    fn rust_files(path: &Path, out: &mut Vec<PathBuf>) {
        if path.is_file() {
            out.push(path.to_owned());
        } else if let Ok(entries) = std::fs::read_dir(path) {
            for entry in entries.flatten() {
                let entry = entry.path();
                if entry.is_dir() || entry.extension().is_some_and(|e| e == "rs") {
                    rust_files(&entry, out);
                }
            }
        }
    }

    /// The groups a line of code names through `crate::<group>` or enough `super::` to reach the
    /// crate root from `depth` (1 for `src/<group>.rs`, 2 for `src/<group>/x.rs`, ...).
    fn named_groups(line: &str, depth: usize) -> Vec<String> {
        let mut found = Vec::new();
        let mut rest = line;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            found.push(rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect());
        }
        let climb = "super::".repeat(depth);
        let mut rest = line;
        while let Some(at) = rest.find(&climb) {
            rest = &rest[at + climb.len()..];
            let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            if name != "super" {
                found.push(name);
            }
        }
        found
    }

    #[test]
    fn every_group_uses_only_the_groups_below_it() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut violations = Vec::new();
        let mut checked = 0;
        for (rank, group) in LAYERS.iter().enumerate() {
            let mut files = Vec::new();
            rust_files(&src.join(format!("{group}.rs")), &mut files);
            rust_files(&src.join(group), &mut files);
            assert!(!files.is_empty(), "no source for the group {group}");
            for file in files {
                let relative = file.strip_prefix(&src).expect("under src");
                let depth = relative.components().count();
                let text = std::fs::read_to_string(&file).expect("readable source");
                for (number, line) in text.lines().enumerate() {
                    // Doc links and comments may point anywhere; code may not.
                    if line.trim_start().starts_with("//") {
                        continue;
                    }
                    checked += 1;
                    for named in named_groups(line, depth) {
                        let Some(target) = LAYERS.iter().position(|layer| *layer == named) else { continue };
                        if target > rank {
                            violations.push(format!("{}:{}: {group} uses {named}", relative.display(), number + 1));
                        }
                    }
                }
            }
        }
        assert!(checked > 10_000, "read only {checked} lines: the groups moved?");
        assert!(violations.is_empty(), "arrows that point up:\n{}", violations.join("\n"));
    }

    #[test]
    fn the_scan_sees_crate_paths_and_climbs_to_the_root() {
        assert_eq!(named_groups("use crate::store::{Store, TaskRow};", 1), ["store"]);
        assert_eq!(
            named_groups("    let x = crate::actors::fabric::Fabric::new(super::config::X);", 1),
            ["actors", "config"]
        );
        assert_eq!(named_groups("use super::super::doors::api;", 2), ["doors"]);
        assert!(named_groups("use super::phase::Phase;", 2).is_empty(), "a sibling, not the root");
    }

    /// The Rust sources whose comments are read, relative to this crate: every crate of the
    /// workspace, its tests, benches and build scripts.
    const COMMENTED_SOURCES: [&str; 12] = [
        "src",
        "tests",
        "benches",
        "build.rs",
        "../runner-agent/src",
        "../runner-agent/tests",
        "../kernel-tools/src",
        "../proto/src",
        "../proto/build.rs",
        "../tests/src",
        "../tests/tests",
        "../tests/benches",
    ];

    /// Documents that are not in the repository, so a comment may not send a reader to them.
    const ABSENT_DOCUMENTS: [&str; 5] = ["REFERENCE.md", "SPEC-0", "DESIGN.md", "FACTS.md", "CONVENTIONS.md"];

    /// What may join a further heading of the same file onto a citation, as in `"Claim" and
    /// "Extend"` or `"Announce" through "Progress"`.
    const HEADING_JOINS: [&str; 6] = ["and", ",", ";", "or", "to", "through"];

    /// Each file of `docs/` with the text of its `#` headings.
    fn docs_headings(docs: &Path) -> BTreeMap<String, BTreeSet<String>> {
        let mut found = BTreeMap::new();
        for entry in std::fs::read_dir(docs).expect("docs/ is readable").flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "md") {
                let text = std::fs::read_to_string(&path).expect("readable document");
                let headings = text
                    .lines()
                    .filter(|line| line.starts_with('#'))
                    .map(|line| line.trim_start_matches('#').trim().to_owned())
                    .collect();
                let name = path.file_name().expect("a file name").to_string_lossy().into_owned();
                found.insert(name, headings);
            }
        }
        found
    }

    /// The comment text of a line, if it has one: the whole line after `//`, `///` or `//!`, or a
    /// trailing `// ...` after code (outside a string literal).
    fn comment_of(line: &str) -> Option<&str> {
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed.strip_prefix("//") {
            return Some(rest.trim_start_matches(['/', '!']).trim());
        }
        let mut quotes = 0;
        let bytes = line.as_bytes();
        for (at, byte) in bytes.iter().enumerate() {
            match byte {
                b'"' if at == 0 || bytes[at - 1] != b'\\' => quotes += 1,
                b'/' if quotes % 2 == 0 && line[at..].starts_with("// ") && at > 0 && bytes[at - 1] == b' ' => {
                    return Some(line[at + 2..].trim());
                }
                _ => {}
            }
        }
        None
    }

    /// The quoted text at the start of `text` (after blanks), and what follows it.
    fn quoted(text: &str) -> Option<(&str, &str)> {
        let rest = text.trim_start().strip_prefix('"')?;
        let end = rest.find('"')?;
        Some((&rest[..end], &rest[end + 1..]))
    }

    /// Every offence of one source file, as `label:line: what`: a comment that names a document
    /// outside the repository, or a `docs/<file>.md` citation whose file or quoted heading does not
    /// exist. Consecutive comment lines are read as one text, so a heading may wrap.
    fn citation_offences(label: &str, source: &str, docs: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
        let mut offences = Vec::new();
        // Runs of comment lines: the joined text, and where each line's text starts in it.
        let mut runs: Vec<(String, Vec<(usize, usize)>)> = Vec::new();
        let mut open = false;
        for (index, line) in source.lines().enumerate() {
            let number = index + 1;
            let Some(comment) = comment_of(line) else {
                open = false;
                continue;
            };
            for absent in ABSENT_DOCUMENTS {
                if comment.contains(absent) {
                    offences.push((number, format!("cites {absent}, which is not in the repository")));
                }
            }
            let whole_line = line.trim_start().starts_with("//");
            if !(open && whole_line) {
                runs.push((String::new(), Vec::new()));
            }
            let (text, starts) = runs.last_mut().expect("a run was just opened");
            starts.push((text.len(), number));
            text.push_str(comment);
            text.push(' ');
            open = whole_line;
        }
        for (text, starts) in &runs {
            let line_at = |offset: usize| starts.iter().rev().find(|(start, _)| *start <= offset).map_or(0, |s| s.1);
            let mut from = 0;
            while let Some(found) = text[from..].find("docs/") {
                let at = from + found;
                from = at + "docs/".len();
                if text[..at].chars().next_back().is_some_and(|c| c.is_alphanumeric() || c == '/' || c == '_') {
                    continue;
                }
                let rest = &text[from..];
                let name_len =
                    rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-')).unwrap_or(rest.len());
                let Some(after) = rest[name_len..].strip_prefix(".md") else { continue };
                let file = format!("{}.md", &rest[..name_len]);
                let number = line_at(at);
                let Some(headings) = docs.get(&file) else {
                    offences.push((number, format!("cites docs/{file}, which does not exist")));
                    continue;
                };
                let after = after.strip_prefix('`').unwrap_or(after);
                let Some(mut next) = after.strip_prefix(',') else { continue };
                while let Some((heading, tail)) = quoted(next) {
                    let heading = heading.split_whitespace().collect::<Vec<_>>().join(" ");
                    if !headings.contains(&heading) {
                        offences.push((number, format!("docs/{file} has no heading \"{heading}\"")));
                    }
                    let tail = tail.trim_start();
                    let Some(join) = HEADING_JOINS.iter().find(|join| tail.starts_with(*join)) else { break };
                    next = &tail[join.len()..];
                }
            }
        }
        offences.sort_by_key(|(number, _)| *number);
        offences.into_iter().map(|(number, what)| format!("{label}:{number}: {what}")).collect()
    }

    #[test]
    fn comments_cite_the_repositorys_own_documents() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let docs = docs_headings(&root.join("../docs"));
        assert!(docs.len() >= 4, "the docs moved? found {:?}", docs.keys());
        let mut offences = Vec::new();
        let mut files = Vec::new();
        for source in COMMENTED_SOURCES {
            let path = root.join(source);
            assert!(path.exists(), "{source} moved: update COMMENTED_SOURCES");
            rust_files(&path, &mut files);
        }
        assert!(files.len() > 100, "read only {} files", files.len());
        let mut citations = 0;
        for file in &files {
            let text = std::fs::read_to_string(file).expect("readable source");
            citations += text.matches("docs/").count();
            let label = file.strip_prefix(root).unwrap_or(file).display().to_string();
            offences.extend(citation_offences(&label, &text, &docs));
        }
        assert!(citations > 100, "only {citations} mentions of docs/: the scan reads nothing?");
        assert!(offences.is_empty(), "comments that cite what the repository does not hold:\n{}", offences.join("\n"));
    }

    #[test]
    fn the_citation_scan_reads_wrapped_headings_and_every_joined_one() {
        let docs = BTreeMap::from([(
            "protocol.md".to_owned(),
            BTreeSet::from(["Claim".to_owned(), "Claim status".to_owned(), "Extend".to_owned()]),
        )]);
        let good = concat!(
            "/// Reads it (`docs/protocol.md`, \"Claim\n",
            "/// status\" and \"Extend\").\n",
            "let x = 1; // `docs/protocol.md`\n",
        );
        assert!(citation_offences("a.rs", good, &docs).is_empty());
        let bad = concat!(
            "//! See (`docs/protocol.md`, \"Claim\", \"Commit\").\n",
            "let x = 1; // docs/missing.md\n",
            "let url = \"http://x // docs/missing.md\";\n",
            "/// Per SPEC-000.\n",
        );
        assert_eq!(
            citation_offences("a.rs", bad, &docs),
            [
                "a.rs:1: docs/protocol.md has no heading \"Commit\"",
                "a.rs:2: cites docs/missing.md, which does not exist",
                "a.rs:4: cites SPEC-0, which is not in the repository",
            ]
        );
    }
}
