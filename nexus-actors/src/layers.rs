//! The server's module groups and the one direction their arrows go (`docs/architecture.md`,
//! "Server modules"), checked over the source: a group's code names only groups below it.

/// The groups, lowest first. A group may use any group before it, never one after it; the crate
/// root (`lib.rs`, `main.rs`) wires them all together.
const LAYERS: [&str; 9] = ["clock", "auth", "declaration", "model", "store", "config", "actors", "doors", "cli"];

mod tests {
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
}
