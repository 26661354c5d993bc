//! The main job as README runs it: `nexus quickstart` in a directory of Rust files answers with
//! the line count that a runner-agent process measured.

use std::process::Command;

use nexus_tests::{nexus_binary, runner_agent_binary};

#[test]
fn quickstart_answers_with_the_runners_line_count() {
    let repo = tempfile::tempdir().expect("repo");
    std::fs::create_dir_all(repo.path().join("src/nested")).expect("dirs");
    std::fs::create_dir_all(repo.path().join("target/debug")).expect("dirs");
    std::fs::write(repo.path().join("src/main.rs"), "fn main() {\n    println!(\"hi\");\n}\n").expect("file");
    std::fs::write(repo.path().join("src/nested/lib.rs"), "pub fn a() {}\n\npub fn b() {}\n// end\n").expect("file");
    std::fs::write(repo.path().join("notes.txt"), "not rust\n").expect("file");
    // Files under ./target are not counted by the script's find.
    std::fs::write(repo.path().join("target/debug/build.rs"), "fn ignored() {}\n".repeat(50)).expect("file");

    let output = Command::new(nexus_binary())
        .arg("quickstart")
        .arg("--timeout-secs")
        .arg("120")
        .env("NEXUS_RUNNER_AGENT", runner_agent_binary())
        .env_remove("NEXUS_MODEL")
        .current_dir(repo.path())
        .output()
        .expect("quickstart runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "stdout:\n{stdout}\nstderr:\n{}", String::from_utf8_lossy(&output.stderr));
    // 3 + 4 lines of Rust outside ./target.
    assert!(stdout.contains("final answer: There are 7 lines of Rust"), "{stdout}");
    assert!(stdout.contains("bash on runner quickstart-runner"), "the tool call names its runner: {stdout}");
    assert!(stdout.contains("round 2"), "{stdout}");
}
