//! The tools file read again while the agent runs (`docs/runner-tools.md`, "Reloading"): on
//! SIGHUP, and at the maintenance tick when its content changed. The read and the checks run
//! off the loop; a good file becomes the new catalog, which is announced at once when connected
//! (and by the next connect's announce otherwise); a bad one is logged with its line and field,
//! and the tools stay as they were. A call already running keeps the tool it started with.

use std::path::Path;

use nexus_proto::runner::v1::Announce;
use nexus_proto::runner::v1::runner_frame::Frame as Request;
use tracing::{error, info};

use super::*;

/// Why the file is read again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ReloadCause {
    /// The maintenance tick: only a change of content counts.
    Tick,
    /// SIGHUP: the file is read and served again even when its bytes did not change.
    Hangup,
}

impl Agent {
    /// Starts reading the tools file again, unless there is none or a read is under way.
    pub(super) fn start_reload(&mut self, cause: ReloadCause) {
        let Some(path) = self.config.tools_file.clone() else { return };
        if self.reload.is_some() {
            return;
        }
        let last = match cause {
            ReloadCause::Tick => self.tools_digest,
            ReloadCause::Hangup => None,
        };
        if cause == ReloadCause::Hangup {
            info!(path = %path.display(), "sighup: reading the tools file again");
        }
        self.reload = Some(tokio::task::spawn_blocking(move || read_again(&path, last)));
    }

    /// A read of the tools file ended.
    pub(super) fn on_reloaded(&mut self, reloaded: Reloaded) {
        let Some(path) = self.config.tools_file.clone() else { return };
        let refused = match reloaded {
            Reloaded::Unchanged => return,
            Reloaded::Bad(refusal, digest) => {
                if digest.is_some() {
                    self.tools_digest = digest;
                }
                refusal
            }
            Reloaded::Good(file, digest) => {
                self.tools_digest = Some(digest);
                match self.toolbox.replace_tools_file(*file) {
                    Ok(()) => {
                        self.reload_refusal = None;
                        self.reconfigure_mcp();
                        info!(path = %path.display(), tools = self.toolbox.catalog().specs().count(), "the tools file changed; serving its tools");
                        return;
                    }
                    Err(err) => ToolsFileError::of_catalog(&path, &err),
                }
            }
        };
        // A file that stays bad is said once, not at every tick.
        if self.reload_refusal.as_ref() != Some(&refused) {
            let (line, column) = refused.location.unwrap_or_default();
            error!(
                path = %path.display(), line, column, field = refused.field.as_deref().unwrap_or(""),
                problem = ?refused.problem, reason = %refused.reason,
                "the tools file was refused; the tools stay as they were"
            );
            self.reload_refusal = Some(refused);
        }
    }

    /// The catalog changed: announce it now when connected (a connect announces it anyway).
    pub(super) fn on_catalog_changed(&mut self) {
        self.catalog.borrow_and_update();
        if self.link.is_none() || self.draining {
            return;
        }
        let body_json = self.toolbox.announcement().to_string();
        self.send_request(Request::Announce(Announce { body_json }), Pending::Announce);
        // A raised bound may let a waiting hint go.
        self.pump_claims();
    }
}

impl Agent {
    /// The hub's tools changed (a server came up, went down, or listed anew): the catalog
    /// takes them, which announces them. A catalog they would break (a name a command tool has,
    /// a list over nexus's bound) keeps the tools it had, and says why.
    pub(super) fn on_mcp_changed(&mut self) {
        self.mcp_changes.borrow_and_update();
        let Some(hub) = &self.mcp else { return };
        match self.toolbox.set_extra_tools_holding_back(mcp::extra_tools(hub)) {
            Ok(held_back) => {
                for name in held_back {
                    error!(tool = %name, "an MCP tool has the name of another tool; it is not served (rename one, or give its server another prefix)");
                }
            }
            Err(err) => error!(error = %err, "the MCP servers' tools were not taken; the tools stay as they were"),
        }
    }

    /// Gives the hub the MCP servers of the tools file now served, after the reconfiguration
    /// under way (so that two reloads apply in order).
    fn reconfigure_mcp(&mut self) {
        let Some(hub) = self.mcp.clone() else { return };
        let servers = self.toolbox.tools_file().mcp_servers.clone();
        let before = self.mcp_reconfiguring.take();
        self.mcp_reconfiguring = Some(tokio::spawn(async move {
            if let Some(before) = before {
                let _ = before.await;
            }
            hub.reconfigure(servers).await;
        }));
    }
}

/// Reads the file; `Unchanged` when its digest is `last`. Blocking.
fn read_again(path: &Path, last: Option<FileDigest>) -> Reloaded {
    let (text, digest) = match toolsfile::read(path) {
        Ok(read) => read,
        Err(refusal) => return Reloaded::Bad(refusal, None),
    };
    if last == Some(digest) {
        return Reloaded::Unchanged;
    }
    match toolsfile::parse(path, &text) {
        Ok(file) => Reloaded::Good(Box::new(file), digest),
        Err(refusal) => Reloaded::Bad(refusal, Some(digest)),
    }
}

/// Waits for the reload under way; never resolves without one.
pub(super) async fn poll_reload(reload: &mut Option<tokio::task::JoinHandle<Reloaded>>) -> Reloaded {
    let Some(handle) = reload else { return std::future::pending().await };
    let joined = handle.await;
    *reload = None;
    joined.unwrap_or_else(|err| {
        Reloaded::Bad(
            ToolsFileError::whole_file(Path::new(""), Problem::Unreadable, format!("the read crashed: {err}")),
            None,
        )
    })
}

/// The next SIGHUP; never resolves without a listener.
pub(super) async fn hangup(signal: &mut Option<tokio::signal::unix::Signal>) {
    match signal {
        Some(signal) => {
            if signal.recv().await.is_none() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}
