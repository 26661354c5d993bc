//! Announced names of MCP tools: `<prefix>_<tool>`, always inside the provider rule
//! `^[a-zA-Z0-9_-]{1,64}$` (`docs/protocol.md`, "Announce").
//!
//! A character outside `[a-zA-Z0-9_-]` becomes `_` (one per character, so `é` is one `_`). A name
//! longer than 64 keeps its first 55 characters, then `_` and 8 hex digits of the SHA-256 of the
//! full unmapped name; so do all names that come out equal after mapping. The mapping depends only
//! on the names it is given, in their order: the same servers listing the same tools get the same
//! names on every runner and after every restart.

use std::collections::{BTreeMap, HashSet};

use sha2::{Digest, Sha256};

/// Longest announced name, in characters (all ASCII).
pub(crate) const MAX_NAME_CHARS: usize = 64;
/// Characters kept before the hash suffix of a hashed name.
const HASHED_KEEP_CHARS: usize = 55;
/// Hex digits of the SHA-256 suffix.
const HASH_HEX_DIGITS: usize = 8;

/// Whether `name` fits `^[a-zA-Z0-9_-]{1,64}$`.
pub(crate) fn is_valid_name(name: &str) -> bool {
    (1..=MAX_NAME_CHARS).contains(&name.len()) && name.bytes().all(is_name_byte)
}

fn is_name_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-'
}

/// `text` with every character outside `[a-zA-Z0-9_-]` replaced by `_`.
fn sanitize(text: &str) -> String {
    text.chars().map(|ch| if ch.is_ascii() && is_name_byte(ch as u8) { ch } else { '_' }).collect()
}

/// The hashed form: the first 55 characters of the mapped name, `_`, and 8 hex digits of the
/// SHA-256 of `full` (the unmapped `<prefix>_<tool>`). Always 1..=64 valid characters.
fn hashed(mapped: &str, full: &str) -> String {
    let digest = Sha256::digest(full.as_bytes());
    let hex = hex::encode(digest);
    // `mapped` is ASCII, so byte and character positions agree.
    let keep = &mapped[..mapped.len().min(HASHED_KEEP_CHARS)];
    format!("{keep}_{}", &hex[..HASH_HEX_DIGITS])
}

/// The announced names of `tools`, each `(prefix, tool name)`, in the same order: `Some(name)`, or
/// `None` for a tool whose name is taken by an earlier one even after hashing (the same prefix and
/// tool name twice), which is not announced.
pub(crate) fn announced_names<'a>(tools: impl IntoIterator<Item = (&'a str, &'a str)>) -> Vec<Option<String>> {
    let candidates: Vec<(String, String)> = tools
        .into_iter()
        .map(|(prefix, tool)| {
            let full = format!("{prefix}_{tool}");
            let mapped = sanitize(&full);
            (full, mapped)
        })
        .collect();
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, mapped) in &candidates {
        *counts.entry(mapped.as_str()).or_default() += 1;
    }
    let mut taken = HashSet::new();
    candidates
        .iter()
        .map(|(full, mapped)| {
            let name = if mapped.len() > MAX_NAME_CHARS || counts.get(mapped.as_str()).is_some_and(|n| *n > 1) {
                hashed(mapped, full)
            } else {
                mapped.clone()
            };
            taken.insert(name.clone()).then_some(name)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(tools: &[(&str, &str)]) -> Vec<Option<String>> {
        announced_names(tools.iter().copied())
    }

    fn suffix(full: &str) -> String {
        hex::encode(Sha256::digest(full.as_bytes()))[..8].to_owned()
    }

    #[test]
    fn plain_names_are_prefix_underscore_tool() {
        assert_eq!(
            names(&[("fs", "read"), ("fs", "write-all"), ("git", "Log_2")]),
            [Some("fs_read".to_owned()), Some("fs_write-all".to_owned()), Some("git_Log_2".to_owned())]
        );
    }

    #[test]
    fn characters_outside_the_rule_become_underscores_one_per_character() {
        let got = names(&[("fs", "read.file"), ("db", "créer table"), ("x", "😀/y")]);
        assert_eq!(got, [Some("fs_read_file".to_owned()), Some("db_cr_er_table".to_owned()), Some("x___y".to_owned())]);
        assert!(got.iter().flatten().all(|name| is_valid_name(name)));
    }

    #[test]
    fn long_names_keep_55_characters_and_a_hash_of_the_full_name() {
        let tool = "t".repeat(200);
        let full = format!("srv_{tool}");
        let got = names(&[("srv", &tool)]);
        let name = got[0].clone().expect("announced");
        assert_eq!(name.len(), 64);
        assert_eq!(name, format!("{}_{}", &full[..55], suffix(&full)));
        assert!(is_valid_name(&name));
        // Exactly 64 characters is kept as it is.
        let tool = "u".repeat(60);
        assert_eq!(names(&[("abc", &tool)]), [Some(format!("abc_{tool}"))]);
        // A long unicode name is mapped first, then hashed over the unmapped text.
        let tool = "é".repeat(100);
        let full = format!("p_{tool}");
        let name = names(&[("p", &tool)])[0].clone().expect("announced");
        assert_eq!(name, format!("p_{}_{}", "_".repeat(53), suffix(&full)));
        assert!(is_valid_name(&name));
    }

    #[test]
    fn names_equal_after_mapping_are_all_hashed_and_differ() {
        let got = names(&[("fs", "a.b"), ("fs", "a_b"), ("fs", "c")]);
        assert_eq!(got[0], Some(format!("fs_a_b_{}", suffix("fs_a.b"))));
        assert_eq!(got[1], Some(format!("fs_a_b_{}", suffix("fs_a_b"))));
        assert_eq!(got[2], Some("fs_c".to_owned()));
        assert_ne!(got[0], got[1]);
        // Across servers: prefix `x` with `y_z` and prefix `x_y` with `z`.
        let got = names(&[("x", "y_z"), ("x_y", "z")]);
        assert_ne!(got[0], got[1]);
        assert!(got.iter().flatten().all(|name| is_valid_name(name)));
    }

    #[test]
    fn the_same_full_name_twice_announces_only_the_first() {
        let got = names(&[("fs", "read"), ("fs", "read")]);
        assert_eq!(got[0], Some(format!("fs_read_{}", suffix("fs_read"))));
        assert_eq!(got[1], None);
    }

    #[test]
    fn the_mapping_is_deterministic() {
        let tools: Vec<(String, String)> =
            (0..50).map(|i| (format!("p{}", i % 3), format!("tool.{i}.{}", "n".repeat(i * 3)))).collect();
        let once = announced_names(tools.iter().map(|(p, t)| (p.as_str(), t.as_str())));
        let twice = announced_names(tools.iter().map(|(p, t)| (p.as_str(), t.as_str())));
        assert_eq!(once, twice);
        assert!(once.iter().all(|name| name.as_deref().is_some_and(is_valid_name)));
        let unique: HashSet<_> = once.iter().collect();
        assert_eq!(unique.len(), once.len());
    }

    #[test]
    fn the_rule_itself() {
        assert!(is_valid_name("a"));
        assert!(is_valid_name(&"a".repeat(64)));
        assert!(!is_valid_name(""));
        assert!(!is_valid_name(&"a".repeat(65)));
        assert!(!is_valid_name("a.b"));
        assert!(!is_valid_name("é"));
    }
}
