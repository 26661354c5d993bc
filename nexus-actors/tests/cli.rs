//! The `nexus` binary as an operator runs it: serve, admin, a second server on the same data
//! dir, and a graceful SIGTERM.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

fn nexus() -> Command {
    Command::new(env!("CARGO_BIN_EXE_nexus"))
}

/// A `nexus serve` child that is killed when the test ends without taking it, so that a failed
/// assertion never leaves a server running (it would hold the data dir and whatever it inherited).
struct Served(Option<Child>);

impl Served {
    /// The child, for a test that ends it itself.
    fn take(&mut self) -> Child {
        self.0.take().expect("the server is still held")
    }

    fn id(&self) -> u32 {
        self.0.as_ref().expect("the server is still held").id()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Starts `nexus serve` on 127.0.0.1:0 and reads the bound address from its log. The server is
/// killed when the returned guard drops.
fn serve(data_dir: &std::path::Path) -> (Served, String, std::sync::mpsc::Receiver<String>) {
    let mut child = nexus()
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data_dir)
        .env("NEXUS_LOG", "info")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("nexus serve starts");
    let stderr = child.stderr.take().expect("stderr");
    let child = Served(Some(child));
    let (lines_tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                return;
            }
        }
    });
    // Each line within 30 s: serve logs a few lines at start, the address among them.
    loop {
        let line = lines.recv_timeout(Duration::from_secs(30)).expect("serve logs its address");
        if let Some(addr) = line.split("addr=").nth(1).and_then(|rest| rest.split_whitespace().next()) {
            return (child, addr.to_owned(), lines);
        }
    }
}

fn admin(data_dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    nexus().arg("admin").args(args).arg("--data-dir").arg(data_dir).output().expect("nexus admin runs")
}

#[test]
fn admin_refuses_a_data_dir_without_a_store() {
    let dir = tempfile::tempdir().expect("dir");
    let typo = dir.path().join("typo");
    let out = admin(&typo, &["member", "create", "--kind", "agent", "--handle", "helper"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no nexus store"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!typo.join("nexus.db").exists(), "a typo must not create an empty store");
}

#[test]
fn serve_refuses_client_auth_without_a_client_ca() {
    let dir = tempfile::tempdir().expect("dir");
    let config = dir.path().join("nexus.toml");
    std::fs::write(&config, "[tls]\nclient_auth = \"required\"\n").expect("write");
    let out = nexus()
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        // An operator who exported it for another program still gets the message alone.
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("tls.client_auth") && stderr.contains("client_ca"), "{stderr}");
    assert!(stderr.starts_with("error: "), "one line that says what is wrong: {stderr}");
    assert!(!stderr.to_lowercase().contains("backtrace"), "no backtrace after a refusal: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
}

#[test]
fn a_config_refusal_is_said_once() {
    let dir = tempfile::tempdir().expect("dir");
    let config = dir.path().join("nexus.toml");
    std::fs::write(&config, "[execution]\nbogus = 1\n").expect("write");
    let out = nexus()
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("error: invalid config file"), "{stderr}");
    assert_eq!(stderr.matches("bogus").count(), 2, "the key and its excerpt, once each: {stderr}");
}

#[test]
fn serve_admin_and_a_graceful_sigterm() {
    let dir = tempfile::tempdir().expect("dir");
    let (mut server, addr, lines) = serve(dir.path());

    let out = admin(dir.path(), &["member", "create", "--kind", "agent", "--handle", "helper"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let member: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(member["kind"], "agent");
    assert!(member["token"].as_str().is_some_and(|t| t.starts_with("sk-nexus-api-v1-")));
    // A runner serves the Agents it is assigned to (`docs/protocol.md`, "Assignment").
    let agent_id = member["public_id"].as_str().expect("id");
    let out = admin(dir.path(), &["runner", "create", "--name", "worker-1", "--assign", agent_id]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let runner: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert!(runner["runner_executor_public_id"].as_str().is_some());
    assert_eq!(runner["assigned_agent_public_ids"], serde_json::json!([agent_id]));
    let out = admin(dir.path(), &["member", "create", "--kind", "agent", "--handle", "helper"]);
    assert!(!out.status.success(), "a taken handle is refused");

    // Revocation is final: re-pairing a revoked runner fails instead of printing a dead token.
    let runner_id = runner["runner_executor_public_id"].as_str().expect("id");
    let out = admin(dir.path(), &["runner", "revoke", "--runner-id", runner_id]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = admin(dir.path(), &["runner", "repair", "--runner-id", runner_id]);
    assert!(!out.status.success(), "a revoked runner is not paired again");
    assert!(out.stdout.is_empty(), "no token is printed: {}", String::from_utf8_lossy(&out.stdout));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not_eligible"), "{}", String::from_utf8_lossy(&out.stderr));

    // A second server on the same data dir refuses to start.
    let second =
        nexus().args(["serve", "--listen", "127.0.0.1:0", "--data-dir"]).arg(dir.path()).output().expect("runs");
    assert!(!second.status.success());
    assert!(String::from_utf8_lossy(&second.stderr).contains("in use"), "{}", String::from_utf8_lossy(&second.stderr));

    // SIGTERM (what systemd sends) shuts down in order and exits 0.
    let pid = nix::unistd::Pid::from_raw(i32::try_from(server.id()).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("signal");
    let (exited_tx, exited) = std::sync::mpsc::channel();
    let mut child = server.take();
    std::thread::spawn(move || {
        let _ = exited_tx.send(child.wait());
    });
    let status = exited.recv_timeout(Duration::from_secs(20)).expect("nexus exits after SIGTERM").expect("wait");
    assert!(status.success(), "{status}");
    let logged: Vec<String> = lines.try_iter().collect();
    assert!(logged.iter().any(|l| l.contains("shutting down")), "{logged:?}");
    assert!(!addr.is_empty());
}
