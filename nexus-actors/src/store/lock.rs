//! The locks `nexus serve` holds for its whole life (`docs/architecture.md`, "One node per
//! store", and `docs/cluster.md`).
//!
//! - On either backend it holds an exclusive `flock` on `DATA_DIR/nexus.lock` (released by the
//!   kernel when the process dies, however it dies); on SQLite that is the store itself, since
//!   the store is `DATA_DIR/nexus.db`, so SQLite stays one node: a second `nexus serve` on the
//!   data dir is refused, naming the holder (its pid and address) from the file.
//! - On PostgreSQL, several nodes share the database, each with its own data dir: the node that
//!   holds the serve lease drives the work and the others wait as standbys
//!   ([`super::lease`]). When the lease is lost (another node took it over after this node
//!   froze or lost the database), the node stops serving ([`ServeLock::lost`]) rather than
//!   drive work another node now owns; its writes were already refused by the fence.
//!
//! `nexus admin` and [`Store::connect`](super::Store::connect) take neither: they work beside a
//! running node.

use std::io::{Read, Seek, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use super::lease::Lease;

/// Why a node may not serve this store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// Another `nexus serve` holds the data dir.
    #[error(
        "the data dir {} is in use by another nexus ({holder}); a data dir serves one node, and so does an SQLite store: stop that one first (kill -TERM its pid, or systemctl stop nexus), or give this one another --data-dir; several nodes share a PostgreSQL database instead, each with its own data dir (README, \"Running several nodes\")",
        path.display()
    )]
    DataDirInUse {
        /// The data dir.
        path: PathBuf,
        /// What the lock file says about its holder.
        holder: String,
    },
    /// The data dir cannot be created or locked.
    #[error("cannot use the data dir {}: {source}", path.display())]
    DataDir {
        /// The data dir.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The database's serve lease could not be read or taken.
    #[error("cannot take the serve lease of the database {url}: {reason}")]
    Database {
        /// The database URL, its password redacted.
        url: String,
        /// What failed.
        reason: String,
    },
}

/// The locks of a serving node, held until [`ServeLock::release`] or drop.
#[derive(Debug)]
pub struct ServeLock {
    _data_dir: std::fs::File,
    lease: Option<Lease>,
}

impl ServeLock {
    /// Takes the data dir's lock for a node that serves at `addr`. Call it before the store is
    /// opened, so that a refused node changes nothing (not even the schema).
    ///
    /// # Errors
    /// [`LockError::DataDirInUse`] naming the holder when another node serves the data dir;
    /// [`LockError::DataDir`] when the lock cannot be taken at all.
    pub fn acquire(data_dir: &Path, addr: SocketAddr) -> Result<ServeLock, LockError> {
        Ok(ServeLock { _data_dir: lock_data_dir(data_dir, addr)?, lease: None })
    }

    /// Keeps `lease` (PostgreSQL) with the data dir's lock: [`ServeLock::lost`] then watches it.
    pub fn hold(&mut self, lease: Lease) {
        self.lease = Some(lease);
    }

    /// The serve lease's generation, when one is held.
    pub fn generation(&self) -> Option<i64> {
        self.lease.as_ref().map(|lease| lease.generation)
    }

    /// Resolves when the serve lease is lost, with why; never on SQLite.
    pub fn lost(&self) -> impl Future<Output = String> + Send + 'static {
        let lost = self.lease.as_ref().map(Lease::lost);
        async move {
            let Some(mut lost) = lost else { return std::future::pending().await };
            let reason = match lost.wait_for(Option::is_some).await {
                Ok(reason) => reason.clone(),
                // Released on purpose: nothing was lost.
                Err(_) => None,
            };
            match reason {
                Some(reason) => reason,
                None => std::future::pending().await,
            }
        }
    }

    /// Gives the serve lease up and waits until the database has (so that a standby takes it at
    /// its next poll); the data dir's lock goes when this value drops.
    pub async fn release(&mut self) {
        if let Some(lease) = &mut self.lease {
            lease.release().await;
        }
    }
}

/// Takes `DIR/nexus.lock` and writes the holder into it.
fn lock_data_dir(dir: &Path, addr: SocketAddr) -> Result<std::fs::File, LockError> {
    let fail = |source| LockError::DataDir { path: dir.to_owned(), source };
    std::fs::create_dir_all(dir).map_err(fail)?;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(dir.join("nexus.lock"))
        .map_err(fail)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = holder.trim();
            let holder = if holder.is_empty() { "its holder wrote no pid".to_owned() } else { holder.to_owned() };
            return Err(LockError::DataDirInUse { path: dir.to_owned(), holder });
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(fail(e)),
    }
    // Informational only: the flock is the lock.
    let holder = format!("pid {}, listening on {addr}", std::process::id());
    let written = file.set_len(0).and_then(|()| file.rewind()).and_then(|()| writeln!(file, "{holder}"));
    if let Err(error) = written {
        tracing::debug!(%error, "cannot write the holder into nexus.lock");
    }
    Ok(file)
}
