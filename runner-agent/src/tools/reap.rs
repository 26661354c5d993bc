//! Killing what a bash call leaves behind, wherever it went.
//!
//! Each call's shell leads its own process group, which dies with the call. A process that
//! leaves the group (`setsid`, a daemon's double fork) is found by its environment instead: every
//! bash call runs with [`OWNER_VAR`] set to this state dir's [`Owner`] mark and [`CALL_VAR`] to a
//! mark of the call's own, and every process it starts inherits them. When the call ends, every
//! process carrying its call mark is killed; when runner-agent stops, and when it starts (after a
//! crash or SIGKILL of the previous run), every process carrying its owner mark is. The mark is
//! derived from the state directory, which one runner-agent at a time holds, so the processes
//! found belong to no one else.
//!
//! Not found: a process that both leaves its process group and clears or rewrites its
//! environment (`env -i setsid ...`), or one this user may not read (a setuid program).

use std::io::Read;
use std::path::Path;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use sha2::{Digest, Sha256};

/// Names the state directory (as a mark) in the environment of every bash call.
pub(crate) const OWNER_VAR: &str = "NEXUS_RUNNER_OWNER";
/// Names the call (as a mark) in the environment of every bash call.
pub(crate) const CALL_VAR: &str = "NEXUS_RUNNER_CALL";
/// A sweep kills, looks again (the killed processes' children are reparented, and a fork may have
/// raced the scan), and stops when a round finds nothing, or after this many rounds.
const MAX_ROUNDS: usize = 8;
/// Bytes of a process's environment read when looking for a mark.
const ENVIRON_READ_BYTES: u64 = 1024 * 1024;

/// The mark of one state directory: 16 hex digits of the SHA-256 of its canonical path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Owner(String);

impl Owner {
    /// The mark of `state_dir` (canonicalized when it exists).
    pub(crate) fn of_state_dir(state_dir: &Path) -> Owner {
        let canonical = state_dir.canonicalize().unwrap_or_else(|_| state_dir.to_owned());
        let digest = Sha256::digest(canonical.as_os_str().as_encoded_bytes());
        Owner(hex::encode(&digest[..8]))
    }

    /// The mark's text, as [`OWNER_VAR`] carries it.
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }

    /// A fresh mark for one call: the owner's mark and 16 random hex digits.
    pub(crate) fn new_call(&self) -> String {
        format!("{}-{:016x}", self.0, rand::random::<u64>())
    }
}

/// SIGKILLs every process but this one whose environment holds `var=value`, until a scan finds
/// none (at most [`MAX_ROUNDS`] rounds). Answers how many were killed. Blocking: it reads /proc.
pub(crate) fn kill_marked(var: &str, value: &str) -> usize {
    let needle = format!("{var}={value}").into_bytes();
    let mut killed = std::collections::HashSet::new();
    for _ in 0..MAX_ROUNDS {
        // A process killed in an earlier round may not have exited yet; only new ones count.
        let found: Vec<Pid> = marked(&needle).into_iter().filter(|pid| !killed.contains(pid)).collect();
        if found.is_empty() {
            break;
        }
        for pid in found {
            // ESRCH: it is gone already.
            if kill(pid, Signal::SIGKILL).is_ok() {
                killed.insert(pid);
            }
        }
    }
    killed.len()
}

/// The live processes (zombies have no environment left) whose environment holds `needle`.
fn marked(needle: &[u8]) -> Vec<Pid> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let own = std::process::id();
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()))
        .filter(|pid| *pid != own)
        .filter(|pid| environ_holds(*pid, needle))
        .filter_map(|pid| i32::try_from(pid).ok().map(Pid::from_raw))
        .collect()
}

fn environ_holds(pid: u32, needle: &[u8]) -> bool {
    let Ok(file) = std::fs::File::open(format!("/proc/{pid}/environ")) else {
        return false;
    };
    let mut environ = Vec::new();
    if file.take(ENVIRON_READ_BYTES).read_to_end(&mut environ).is_err() {
        return false;
    }
    environ.split(|byte| *byte == 0).any(|entry| entry == needle)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn owner_marks_differ_by_state_dir_and_calls_by_call() {
        let one = tempfile::tempdir().unwrap();
        let two = tempfile::tempdir().unwrap();
        let owner = Owner::of_state_dir(one.path());
        assert_eq!(owner, Owner::of_state_dir(one.path()));
        assert_ne!(owner, Owner::of_state_dir(two.path()));
        assert_eq!(owner.as_str().len(), 16);
        let (a, b) = (owner.new_call(), owner.new_call());
        assert_ne!(a, b);
        assert!(a.starts_with(owner.as_str()));
    }

    #[tokio::test]
    async fn kill_marked_kills_only_the_marked_processes() {
        let dir = tempfile::tempdir().unwrap();
        let owner = Owner::of_state_dir(dir.path());
        let call = owner.new_call();
        let spawn = |mark: &str| {
            std::process::Command::new("sleep")
                .arg("1000")
                .env(CALL_VAR, mark)
                .stdin(std::process::Stdio::null())
                .spawn()
                .unwrap()
        };
        let mut marked = spawn(&call);
        let mut other = spawn(&owner.new_call());
        assert_eq!(kill_marked(CALL_VAR, &call), 1);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(status) = marked.try_wait().unwrap() {
                break status;
            }
            assert!(tokio::time::Instant::now() < deadline, "the marked process survived");
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert!(!status.success());
        assert!(other.try_wait().unwrap().is_none(), "a process of another call was killed");
        assert_eq!(kill_marked(CALL_VAR, &call), 0);
        other.kill().unwrap();
        other.wait().unwrap();
    }
}
