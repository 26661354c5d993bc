//! Skills served from a directory (`--skills-dir DIR`): each `DIR/<name>/SKILL.md` is announced
//! as a document `{name, description}` beside the `skill` tool, whose call `{name}` returns the
//! file's content (`docs/kernel-tools.md`, "skill").
//!
//! - `name` is the folder's name and must follow the skill grammar `^[a-z0-9](?:-?[a-z0-9])*$`
//!   with at most 64 characters; any other folder is skipped with a warning.
//! - The description is the `description:` line of a leading `---` front-matter block, else the
//!   first non-empty line, cut to [`DESCRIPTION_BOUND`] bytes on a character boundary; a file with
//!   neither is skipped.
//! - At most [`MAX_SKILLS`] are announced (in name order), and a call reads at most
//!   [`CONTENT_BOUND`] bytes of the file.
//!
//! The directory is read at every announcement (every connect), never watched.

use std::io::Read;
use std::path::Path;

use serde_json::{Map, Value, json};
use tracing::warn;

use super::ToolOutcome;

/// The bound of a description, in bytes (nexus refuses a longer one).
pub(crate) const DESCRIPTION_BOUND: usize = 1024;
/// The most skills one announcement carries.
pub(crate) const MAX_SKILLS: usize = 256;
/// The most bytes of a `SKILL.md` a call returns.
pub(crate) const CONTENT_BOUND: usize = 262_144;
/// The bytes of a `SKILL.md` read to find its description.
const HEAD_BOUND: usize = 16_384;
/// The skill file inside each skill's folder.
const SKILL_FILE: &str = "SKILL.md";

/// Whether `name` follows the skill grammar: `^[a-z0-9](?:-?[a-z0-9])*$`, at most 64 characters.
pub(crate) fn is_skill_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    !bytes.is_empty()
        && bytes.len() <= 64
        && alnum(&bytes[0])
        && alnum(&bytes[bytes.len() - 1])
        && bytes.iter().all(|b| alnum(b) || *b == b'-')
        && !name.contains("--")
}

/// `text` cut to at most `bound` bytes on a character boundary.
fn cut(text: &str, bound: usize) -> &str {
    if text.len() <= bound {
        return text;
    }
    let mut end = bound;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The description of a skill file's text: the front matter's `description:`, else the first
/// non-empty line (a front-matter block without one is skipped over), trimmed and cut.
pub(crate) fn description_of(text: &str) -> Option<String> {
    let mut lines = text.lines();
    let mut body: Vec<&str> = Vec::new();
    let mut front: Option<String> = None;
    if text.lines().next().map(str::trim) == Some("---") {
        lines.next();
        let mut closed = false;
        for line in lines.by_ref() {
            if line.trim() == "---" {
                closed = true;
                break;
            }
            if front.is_none()
                && let Some(value) = line.trim_start().strip_prefix("description:")
            {
                front = Some(value.trim().trim_matches(|c| c == '"' || c == '\'').to_owned());
            }
        }
        if !closed {
            // Not front matter after all: the whole text is the body.
            front = None;
            lines = text.lines();
        }
    }
    body.extend(lines);
    let description = front
        .filter(|d| !d.is_empty())
        .or_else(|| body.iter().map(|l| l.trim()).find(|l| !l.is_empty()).map(str::to_owned))?;
    let description = cut(description.trim(), DESCRIPTION_BOUND).trim_end().to_owned();
    (!description.is_empty()).then_some(description)
}

fn head_of(path: &Path) -> std::io::Result<String> {
    let mut bytes = Vec::with_capacity(1024);
    std::fs::File::open(path)?.take(HEAD_BOUND as u64).read_to_end(&mut bytes)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// The documents `dir` holds, in name order, at most [`MAX_SKILLS`]. An unreadable directory
/// announces none (with a warning): the runner still serves its other tools.
pub(crate) fn documents(dir: &Path) -> Vec<Value> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) => {
            warn!(dir = %dir.display(), %error, "cannot read the skills directory; no skills are announced");
            return Vec::new();
        }
    };
    let mut names: Vec<String> = entries
        .filter_map(Result::ok)
        .filter(|entry| entry.path().join(SKILL_FILE).is_file())
        .filter_map(|entry| entry.file_name().into_string().ok())
        .filter(|name| {
            let ok = is_skill_name(name);
            if !ok {
                warn!(skill = %name, "a skill folder's name must match ^[a-z0-9](?:-?[a-z0-9])*$ (at most 64); skipped");
            }
            ok
        })
        .collect();
    names.sort();
    if names.len() > MAX_SKILLS {
        warn!(
            found = names.len(),
            announced = MAX_SKILLS,
            "more skills than one announcement carries; the rest are left out"
        );
        names.truncate(MAX_SKILLS);
    }
    names
        .into_iter()
        .filter_map(|name| {
            let path = dir.join(&name).join(SKILL_FILE);
            let description = match head_of(&path) {
                Ok(text) => description_of(&text),
                Err(error) => {
                    warn!(skill = %name, %error, "cannot read the skill file; skipped");
                    return None;
                }
            };
            let Some(description) = description else {
                warn!(skill = %name, "the skill file has no description and no text; skipped");
                return None;
            };
            Some(json!({"name": name, "description": description}))
        })
        .collect()
}

/// Runs `skill {name}`: the content of `dir/<name>/SKILL.md`, at most [`CONTENT_BOUND`] bytes
/// (a longer file is cut with a note), or `skill_unknown: <name>` as a completed result.
pub(crate) fn load(dir: &Path, input: &Map<String, Value>) -> ToolOutcome {
    let name = match input.get("name") {
        Some(Value::String(name)) => name,
        Some(_) => return ToolOutcome::error("`name` must be a string"),
        None => return ToolOutcome::error("`name` is required"),
    };
    let unknown = || ToolOutcome::Completed {
        content: format!("skill_unknown: {name}"),
        structured_content: json!({"skill_unknown": name}),
        is_error: false,
    };
    // The grammar keeps the name inside the directory: no separator, no `..`.
    if !is_skill_name(name) {
        return unknown();
    }
    let path = dir.join(name).join(SKILL_FILE);
    let file = match std::fs::File::open(&path) {
        Ok(file) if path.is_file() => file,
        Ok(_) => return unknown(),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return unknown(),
        Err(error) => return ToolOutcome::error(format!("cannot read skill {name}: {error}")),
    };
    let mut bytes = Vec::new();
    if let Err(error) = file.take(CONTENT_BOUND as u64 + 1).read_to_end(&mut bytes) {
        return ToolOutcome::error(format!("cannot read skill {name}: {error}"));
    }
    let over = bytes.len() > CONTENT_BOUND;
    bytes.truncate(CONTENT_BOUND);
    let mut content = String::from_utf8_lossy(&bytes).into_owned();
    if over {
        content.push_str(&format!("\n[cut: the skill is longer than {CONTENT_BOUND} bytes]"));
    }
    ToolOutcome::Completed { structured_content: json!({"name": name, "truncated": over}), content, is_error: false }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_skill_grammar() {
        for (name, ok) in [
            ("deploy", true),
            ("deploy-guide", true),
            ("a1-b2-c3", true),
            ("x", true),
            ("Deploy", false),
            ("-deploy", false),
            ("deploy-", false),
            ("de--ploy", false),
            ("de_ploy", false),
            ("..", false),
            ("a/b", false),
            ("", false),
        ] {
            assert_eq!(is_skill_name(name), ok, "{name}");
        }
        assert!(is_skill_name(&"a".repeat(64)));
        assert!(!is_skill_name(&"a".repeat(65)));
    }

    #[test]
    fn the_description_comes_from_front_matter_else_the_first_line() {
        let rows = [
            ("---\nname: x\ndescription: Ship the service safely\n---\n# Deploy\n", Some("Ship the service safely")),
            ("---\ndescription: \"quoted\"\n---\nbody", Some("quoted")),
            ("---\nname: x\n---\n\n  First line of the body  \nsecond", Some("First line of the body")),
            ("\n\n# Triage\nSort bugs", Some("# Triage")),
            ("---\ndescription: never closed\nbody", Some("---")),
            ("", None),
            ("\n   \n", None),
        ];
        for (text, expected) in rows {
            assert_eq!(description_of(text).as_deref(), expected, "{text:?}");
        }
        let long = format!("{}é", "d".repeat(DESCRIPTION_BOUND - 1));
        let cut = description_of(&long).expect("some");
        assert_eq!(cut.len(), DESCRIPTION_BOUND - 1, "cut on a character boundary");
    }

    #[test]
    fn documents_and_load_read_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| {
            std::fs::create_dir_all(dir.path().join(name)).unwrap();
            std::fs::write(dir.path().join(name).join(SKILL_FILE), text).unwrap();
        };
        write("triage", "Sort incoming bugs\nThen label them.");
        write("deploy", "---\ndescription: How to deploy\n---\nStep 1: build.\n");
        write("Bad_Name", "skipped");
        write("empty", "");
        std::fs::create_dir_all(dir.path().join("no-file")).unwrap();
        let announced = documents(dir.path());
        assert_eq!(
            announced,
            vec![
                json!({"name": "deploy", "description": "How to deploy"}),
                json!({"name": "triage", "description": "Sort incoming bugs"}),
            ]
        );
        let input = |name: &str| json!({"name": name}).as_object().cloned().unwrap();
        let loaded = load(dir.path(), &input("deploy"));
        assert_eq!(
            loaded,
            ToolOutcome::Completed {
                content: "---\ndescription: How to deploy\n---\nStep 1: build.\n".into(),
                structured_content: json!({"name": "deploy", "truncated": false}),
                is_error: false,
            }
        );
        for unknown in ["nope", "../deploy", "no-file"] {
            let ToolOutcome::Completed { content, is_error, .. } = load(dir.path(), &input(unknown)) else {
                panic!("{unknown}: a completed result");
            };
            assert_eq!((content, is_error), (format!("skill_unknown: {unknown}"), false));
        }
        assert!(matches!(load(dir.path(), &Map::new()), ToolOutcome::Completed { is_error: true, .. }));
        write("big", &"x".repeat(CONTENT_BOUND + 10));
        let ToolOutcome::Completed { content, .. } = load(dir.path(), &input("big")) else { panic!("completed") };
        assert!(content.starts_with("xxx") && content.ends_with("bytes]"));
        assert!(content.len() < CONTENT_BOUND + 100);
        assert!(documents(&dir.path().join("missing")).is_empty(), "an unreadable directory announces none");
    }
}
