//! The serve lease of a PostgreSQL store: which node drives the executions and runner inboxes,
//! how a standby takes over when that node dies, and the fence that keeps a node that lost the
//! lease from committing anything afterwards (`docs/cluster.md`).
//!
//! The lease is one row, `cluster_lease` named `serve`: its holder (a node id), a generation
//! that grows by one at each take-over, and `lease_until_ms` on the database's clock (so the
//! nodes' own clocks never matter). The holder renews it every quarter of `[cluster] lease_ms`
//! on a connection of its own. A node that starts while another holds it is a standby: it
//! registers in `cluster_nodes`, heartbeats there, and polls the lease every quarter of its
//! term; once the lease lapses (its holder died, froze, or lost the database) it takes it in a
//! transaction that locks the row `FOR UPDATE`, bumps the generation, and recovers the work
//! from the store as after a restart.
//!
//! Fencing: every group-committed transaction of the holder first reads the row
//! `FOR KEY SHARE` with its holder, generation and an unexpired term ([`FENCE_SQL`]); no row
//! means the write is refused ([`super::StoreError::Fenced`]) and the node stops serving.
//! The take-over's `FOR UPDATE` conflicts with that row lock, so either an old holder's
//! transaction commits before the take-over reads the store, or it finds the new generation and
//! commits nothing. Renewal is a plain `UPDATE` of a non-key column, which does not conflict with
//! key-share locks, so heartbeats never wait for writes. The holder also fences itself: when no
//! renewal has succeeded for a whole term measured on its own monotonic clock from the moment
//! the last successful renewal was sent (never later than the database's expiry), it stops.

use std::path::Path;
use std::str::FromStr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, Connection, Row};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use super::backend::redact;
use super::lock::LockError;

/// The database's clock in Unix milliseconds, as every lease statement reads it (a macro, so the
/// statements stay literal text).
macro_rules! now_ms {
    () => {
        "FLOOR(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT"
    };
}

/// The fence check each group-committed transaction of the holder runs first: one row when
/// the lease still names `$1` at generation `$2` and has not expired. In the same statement it
/// bounds how long this transaction may sit idle on the database to `$3` milliseconds (the
/// lease term): a node cut off from the database mid-transaction leaves its session open on the
/// server, and the row locks it holds (this one above all) would keep every other node from
/// taking over until TCP gave up, hours later. PostgreSQL ends such a session after the term.
pub(super) const FENCE_SQL: &str = concat!(
    "SELECT generation, set_config('idle_in_transaction_session_timeout', $3, true) FROM cluster_lease \
     WHERE name = 'serve' AND holder = $1 AND generation = $2 AND lease_until_ms > ",
    now_ms!(),
    " FOR KEY SHARE"
);

/// The fewest milliseconds `[cluster] lease_ms` may be.
pub const LEASE_MS_MIN: u64 = 500;
/// The most milliseconds `[cluster] lease_ms` may be.
pub const LEASE_MS_MAX: u64 = 60_000;
/// The default `[cluster] lease_ms`.
pub const LEASE_MS_DEFAULT: u64 = 5_000;

/// Who this node is: its id (kept in `DATA_DIR/node-id`) and what the listing shows of it.
#[derive(Clone, Debug)]
pub struct NodeIdentity {
    /// The node id: a UUID written once into the data dir, so a restarted node keeps its name.
    pub node_id: String,
    /// The address its doors listen on.
    pub address: String,
    /// The host it runs on: the kernel's host name (`uname -n`).
    pub host: String,
    /// Its process id.
    pub pid: u32,
    /// Its `[cluster] lease_ms` (0 until [`NodeIdentity::with_settings`]).
    pub lease_ms: i64,
    /// The first 16 hex digits of the SHA-256 of its `[providers]` table as JSON (empty until
    /// [`NodeIdentity::with_settings`]).
    pub providers_digest: String,
}

impl NodeIdentity {
    /// The identity of the node that serves from `data_dir` at `address`: reads
    /// `DATA_DIR/node-id`, or writes a new UUID there on first use.
    ///
    /// # Errors
    /// [`LockError::DataDir`] when the file can be neither read nor written.
    pub fn of(data_dir: &Path, address: String) -> Result<NodeIdentity, LockError> {
        let path = data_dir.join("node-id");
        let fail = |source| LockError::DataDir { path: path.clone(), source };
        // The file also records where it was made (the kernel's host name and the data dir's
        // path): a data dir copied to another place or host, the holder's `node-id` with it,
        // must not pass for the holder and take its lease.
        let host = kernel_host_name();
        let here = data_dir.canonicalize().unwrap_or_else(|_| data_dir.to_owned());
        let origin = format!("{host}:{}", here.display());
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let mut lines = text.lines().map(str::trim);
        let kept = lines.next().filter(|id| uuid::Uuid::parse_str(id).is_ok()).map(str::to_owned);
        let node_id = match (kept, lines.next()) {
            (Some(id), Some(made)) if made == origin => id,
            (Some(id), None) => {
                // Written before the origin was recorded: kept, and its origin added.
                std::fs::write(&path, format!("{id}\n{origin}\n")).map_err(fail)?;
                id
            }
            (kept, made) => {
                match (&kept, made) {
                    (Some(id), Some(made)) => tracing::warn!(
                        node_id = %id,
                        made_at = made,
                        here = %origin,
                        "this data dir's node-id was made elsewhere (a copied or moved data dir); this node takes an id of its own"
                    ),
                    _ if !text.trim().is_empty() => tracing::warn!(
                        path = %path.display(),
                        "the node-id file does not start with a UUID; this node takes a new id"
                    ),
                    _ => {}
                }
                let id = uuid::Uuid::new_v4().to_string();
                std::fs::write(&path, format!("{id}\n{origin}\n")).map_err(fail)?;
                id
            }
        };
        Ok(NodeIdentity {
            node_id,
            address,
            host,
            pid: std::process::id(),
            lease_ms: 0,
            providers_digest: String::new(),
        })
    }

    /// This identity with the settings every node of a database should share, which its row
    /// records so that the nodes that differ are told (`docs/cluster.md`, "Settings every node
    /// shares"): `lease_ms`, and the digest of `providers`.
    #[must_use]
    pub fn with_settings(mut self, lease_ms: u64, providers: &crate::model::ProviderTable) -> Self {
        use sha2::Digest;
        self.lease_ms = i64::try_from(lease_ms).unwrap_or(i64::MAX);
        let table = serde_json::to_vec(providers).unwrap_or_default();
        self.providers_digest = hex::encode(&sha2::Sha256::digest(&table)[..8]);
        self
    }
}

/// The kernel's host name (`uname -n`), or `unknown`. Not `$HOSTNAME`: a shell variable that
/// the environment may set or not, where the node-id's origin must be stable.
fn kernel_host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .ok()
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "unknown".to_owned())
}

/// The fence a store's writer checks before each transaction (set once the lease is held).
#[derive(Debug)]
pub struct Fence {
    /// The node id named as holder.
    pub holder: String,
    /// The generation the lease was taken at.
    pub generation: i64,
    /// The lease term in milliseconds, as text: how long a fenced transaction may sit idle on
    /// the database ([`FENCE_SQL`]).
    pub(super) idle_timeout_ms: String,
    /// Said once when a write finds the lease gone.
    pub(super) lost: watch::Sender<Option<String>>,
}

impl Fence {
    /// Marks the lease lost (the first reason wins).
    pub(super) fn lose(&self, reason: String) {
        self.lost.send_if_modified(|held| {
            if held.is_some() {
                return false;
            }
            *held = Some(reason);
            true
        });
    }
}

/// The shared slot of a store's fence: empty on SQLite and until the lease is held.
pub(super) type FenceSlot = Arc<OnceLock<Arc<Fence>>>;

/// The held serve lease: renewed on a thread of its own until [`Lease::release`] or drop.
#[derive(Debug)]
pub struct Lease {
    /// This node's id.
    pub holder: String,
    /// The generation it holds.
    pub generation: i64,
    /// The forwarding secret drawn for this generation: a request that carries it came through
    /// a standby of this database (`doors::forward`).
    pub forward_key: String,
    fence: Arc<Fence>,
    lost: watch::Receiver<Option<String>>,
    release: Option<oneshot::Sender<oneshot::Sender<()>>>,
    /// Stops the renewals without giving the lease up (dropped with the lease).
    abort: Option<oneshot::Sender<()>>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(abort) = self.abort.take() {
            let _ = abort.send(());
        }
    }
}

/// What a standby saw of the lease it waits for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    /// The node holding it.
    pub node_id: String,
    /// The address that node listed.
    pub address: Option<String>,
    /// Milliseconds until it lapses unless renewed.
    pub remaining_ms: i64,
    /// The lease's generation.
    pub generation: i64,
    /// The holder's forwarding secret for this generation (empty: a holder of an older nexus,
    /// to which nothing is forwarded).
    pub forward_key: String,
}

/// A take-over: the new generation, who held the lease before (`None`: nobody ever did;
/// `remaining_ms` of a lapsed holder is how long ago, negated, its term ran out), and whether
/// that holder gave it up (stopped with SIGTERM) rather than let it lapse.
struct Taken {
    generation: i64,
    previous: Option<Holder>,
    given_up: bool,
    forward_key: String,
}

/// A fresh forwarding secret: 32 random bytes as 64 hex digits.
fn new_forward_key() -> String {
    hex::encode(rand::random::<[u8; 32]>())
}

struct Lessee {
    url: String,
    identity: NodeIdentity,
    term: Duration,
    connect_timeout: Duration,
}

impl Lessee {
    fn fail(&self, reason: impl std::fmt::Display) -> LockError {
        LockError::Database { url: redact(&self.url), reason: reason.to_string() }
    }

    async fn connect(&self) -> Result<PgConnection, LockError> {
        let name = format!("nexus node {} pid {}", &self.identity.node_id[..8], self.identity.pid);
        let options = PgConnectOptions::from_str(&self.url).map_err(|e| self.fail(e))?.application_name(&name);
        let mut connection = tokio::time::timeout(self.connect_timeout, options.connect())
            .await
            .map_err(|_| self.fail(format!("no connection within {} ms", self.connect_timeout.as_millis())))?
            .map_err(|e| self.fail(e))?;
        // A node frozen inside its take-over transaction (SIGSTOP, a paused VM) would keep the
        // lease row locked, and every other node's take-over waiting, for as long as it stays
        // frozen: the database ends such a session after a term.
        sqlx::query("SELECT set_config('idle_in_transaction_session_timeout', $1, false)")
            .bind(self.term_ms().to_string())
            .execute(&mut connection)
            .await
            .map_err(|e| self.fail(e))?;
        Ok(connection)
    }

    /// Writes this node's row (`role`, heartbeat now).
    async fn heartbeat(&self, connection: &mut PgConnection, role: &str) -> Result<(), sqlx::Error> {
        const SQL: &str = concat!(
            "INSERT INTO cluster_nodes (node_id, address, host, pid, role, lease_ms, providers_digest, started_at_ms, ",
            "heartbeat_at_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, ",
            now_ms!(),
            ", ",
            now_ms!(),
            ") ON CONFLICT (node_id) DO UPDATE SET address = excluded.address, host = excluded.host, pid = excluded.pid, ",
            "role = excluded.role, lease_ms = excluded.lease_ms, providers_digest = excluded.providers_digest, ",
            "heartbeat_at_ms = excluded.heartbeat_at_ms, started_at_ms = CASE ",
            "WHEN cluster_nodes.pid = excluded.pid THEN cluster_nodes.started_at_ms ELSE excluded.started_at_ms END"
        );
        sqlx::query(SQL)
            .bind(&self.identity.node_id)
            .bind(&self.identity.address)
            .bind(&self.identity.host)
            .bind(i64::from(self.identity.pid))
            .bind(role)
            .bind(self.identity.lease_ms)
            .bind(&self.identity.providers_digest)
            .execute(connection)
            .await
            .map(|_| ())
    }

    /// Warns of each other live node (heartbeat within two terms) whose recorded settings differ
    /// from this node's: its `lease_ms`, or its `[providers]` table. Rows of an older nexus,
    /// which record neither, are skipped.
    async fn warn_of_differing_settings(&self, connection: &mut PgConnection) -> Result<(), sqlx::Error> {
        let rows = sqlx::query(concat!(
            "SELECT node_id, address, lease_ms, providers_digest FROM cluster_nodes WHERE node_id <> $1 ",
            "AND providers_digest <> '' AND heartbeat_at_ms > ",
            now_ms!(),
            " - 2 * $2 ORDER BY node_id"
        ))
        .bind(&self.identity.node_id)
        .bind(self.term_ms())
        .fetch_all(connection)
        .await?;
        for row in rows {
            let node_id: String = row.try_get("node_id")?;
            let address: String = row.try_get("address")?;
            let lease_ms: i64 = row.try_get("lease_ms")?;
            let providers_digest: String = row.try_get("providers_digest")?;
            if lease_ms != self.identity.lease_ms {
                tracing::warn!(
                    node = %node_id,
                    %address,
                    theirs = lease_ms,
                    ours = self.identity.lease_ms,
                    "another node of this database runs with another [cluster] lease_ms: take-overs and the runners' liveness bound follow each node's own; give every node the same nexus.toml"
                );
            }
            if providers_digest != self.identity.providers_digest {
                tracing::warn!(
                    node = %node_id,
                    %address,
                    theirs = %providers_digest,
                    ours = %self.identity.providers_digest,
                    "another node of this database has another [providers] table: after a fail-over onto a node that lacks an execution's model, it halts with provider_model_unavailable; give every node the same [providers] table"
                );
            }
        }
        Ok(())
    }

    /// One attempt: takes the lease when it is free, lapsed, or named for this node (whose
    /// previous process is gone: the data dir's flock says so, and a copy of the data dir
    /// elsewhere has a node id of its own, [`NodeIdentity::of`]). `Ok(Err(holder))` when another
    /// node holds it.
    async fn try_take(&self, connection: &mut PgConnection) -> Result<Result<Taken, Holder>, sqlx::Error> {
        // A live lease of another node is read without a lock. A standby's `FOR UPDATE` would
        // conflict with the holder's renewals and with the `FOR KEY SHARE` of its fenced writes,
        // so a standby frozen between its lock and its commit would stall the node that serves
        // until it lost its own lease. Only a lease that looks lapsed is locked and taken.
        let glance = sqlx::query(concat!(
            "SELECT holder, generation, lease_until_ms - ",
            now_ms!(),
            " AS remaining, forward_key FROM cluster_lease WHERE name = 'serve'"
        ))
        .fetch_one(&mut *connection)
        .await?;
        let holder: Option<String> = glance.try_get("holder")?;
        let remaining: i64 = glance.try_get("remaining")?;
        if let Some(holder) = holder.filter(|holder| *holder != self.identity.node_id && remaining > 0) {
            return Ok(Err(Holder {
                address: address_of(&mut *connection, &holder).await?,
                node_id: holder,
                remaining_ms: remaining,
                generation: glance.try_get("generation")?,
                forward_key: glance.try_get("forward_key")?,
            }));
        }
        let mut tx = connection.begin().await?;
        let row = sqlx::query(concat!(
            "SELECT l.holder, l.generation, l.lease_until_ms, l.lease_until_ms - ",
            now_ms!(),
            " AS remaining, l.forward_key FROM cluster_lease l WHERE l.name = 'serve' FOR UPDATE"
        ))
        .fetch_one(&mut *tx)
        .await?;
        let holder: Option<String> = row.try_get("holder")?;
        let remaining: i64 = row.try_get("remaining")?;
        // A holder stopped with SIGTERM ends its term at 0 ([`hold`]).
        let given_up = row.try_get::<i64, _>("lease_until_ms")? == 0;
        // Read after the lock, not joined to it: a row locked after waiting on another node's
        // take-over is re-read at its new holder, and an outer join is then re-checked against
        // the old holder's node row and comes back empty (PostgreSQL's EvalPlanQual), which
        // left a standby forwarding nowhere for the whole term.
        let address = match &holder {
            Some(holder) => address_of(&mut tx, holder).await?,
            None => None,
        };
        let held_at: i64 = row.try_get("generation")?;
        let forward_key: String = row.try_get("forward_key")?;
        if let Some(holder) = holder.clone().filter(|holder| *holder != self.identity.node_id && remaining > 0) {
            tx.commit().await?;
            return Ok(Err(Holder {
                node_id: holder,
                address,
                remaining_ms: remaining,
                generation: held_at,
                forward_key,
            }));
        }
        let previous = holder.map(|node_id| Holder {
            node_id,
            address,
            remaining_ms: remaining,
            generation: held_at,
            forward_key,
        });
        let forward_key = new_forward_key();
        let generation: i64 = sqlx::query_scalar(concat!(
            "UPDATE cluster_lease SET holder = $1, generation = generation + 1, forward_key = $3, acquired_at_ms = ",
            now_ms!(),
            ", lease_until_ms = ",
            now_ms!(),
            " + $2 WHERE name = 'serve' RETURNING generation"
        ))
        .bind(&self.identity.node_id)
        .bind(self.term_ms())
        .bind(&forward_key)
        .fetch_one(&mut *tx)
        .await?;
        // Delivered at commit: the other standbys read the new holder at once.
        notify(&mut tx, &self.identity.node_id).await?;
        tx.commit().await?;
        Ok(Ok(Taken { generation, previous, given_up, forward_key }))
    }

    fn term_ms(&self) -> i64 {
        i64::try_from(self.term.as_millis()).unwrap_or(i64::MAX)
    }

    /// Renews the lease at `generation`: `Ok(false)` when it no longer names this node there.
    async fn renew(&self, connection: &mut PgConnection, generation: i64) -> Result<bool, sqlx::Error> {
        let renewed = sqlx::query(concat!(
            "UPDATE cluster_lease SET lease_until_ms = ",
            now_ms!(),
            " + $3 WHERE name = 'serve' AND holder = $1 AND generation = $2"
        ))
        .bind(&self.identity.node_id)
        .bind(generation)
        .bind(self.term_ms())
        .execute(&mut *connection)
        .await?
        .rows_affected()
            == 1;
        if renewed {
            self.heartbeat(connection, "active").await?;
        }
        Ok(renewed)
    }
}

/// The address `node_id` advertises, from its row in `cluster_nodes`.
async fn address_of(connection: &mut PgConnection, node_id: &str) -> Result<Option<String>, sqlx::Error> {
    let address = sqlx::query_scalar("SELECT address FROM cluster_nodes WHERE node_id = $1")
        .bind(node_id)
        .fetch_optional(connection)
        .await?;
    Ok(address.flatten())
}

/// The period of renewals and of a standby's polls: a quarter of the term.
fn period(term: Duration) -> Duration {
    (term / 4).max(Duration::from_millis(50))
}

/// The PostgreSQL notification channel a node notifies (payload: its node id) when the serve
/// lease changes hands: when it gives the lease up at SIGTERM, and when it takes it over. A
/// standby that hears it polls at once instead of at its next quarter term. A hint only: the
/// lease row stays the truth, and a notification missed costs at most one poll period.
pub const LEASE_CHANNEL: &str = "nexus_serve_lease";

/// Notifies [`LEASE_CHANNEL`] as `node_id` (inside a transaction, at its commit).
async fn notify(connection: &mut PgConnection, node_id: &str) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pg_notify($1, $2)").bind(LEASE_CHANNEL).bind(node_id).execute(connection).await.map(drop)
}

/// A standby's wake-ups: a task that listens on [`LEASE_CHANNEL`] on a connection of its own and
/// counts what it hears; it is ended when this is dropped.
struct Wakeups {
    heard: watch::Receiver<u64>,
    listener: tokio::task::JoinHandle<()>,
}

impl Drop for Wakeups {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

impl Wakeups {
    /// Starts listening. A connection that cannot be made or is lost is made again a poll period
    /// later; meanwhile the standby polls as it would without it.
    fn start(lessee: &Lessee) -> Wakeups {
        let (heard_tx, heard) = watch::channel(0);
        let (url, timeout, pause) = (lessee.url.clone(), lessee.connect_timeout, period(lessee.term));
        let name = format!("nexus node {} pid {} lease", &lessee.identity.node_id[..8], lessee.identity.pid);
        let listener = tokio::spawn(async move {
            loop {
                let listening = async {
                    let options = PgConnectOptions::from_str(&url)?.application_name(&name);
                    let pool = sqlx::postgres::PgPoolOptions::new()
                        .max_connections(1)
                        .max_lifetime(None)
                        .idle_timeout(None)
                        .acquire_timeout(timeout)
                        .connect_lazy_with(options);
                    let mut listener = sqlx::postgres::PgListener::connect_with(&pool).await?;
                    listener.ignore_pool_close_event(true);
                    listener.listen(LEASE_CHANNEL).await?;
                    Ok::<_, sqlx::Error>(listener)
                };
                match tokio::time::timeout(timeout, listening).await {
                    Ok(Ok(mut listener)) => {
                        tracing::info!(channel = LEASE_CHANNEL, "listening for the serve lease to change hands");
                        // A lost connection is made again inside `recv`; an error ends this one.
                        loop {
                            match listener.recv().await {
                                Ok(_) => heard_tx.send_modify(|heard| *heard += 1),
                                Err(error) => {
                                    tracing::debug!(%error, "stopped hearing the serve lease's notifications");
                                    break;
                                }
                            }
                        }
                    }
                    Ok(Err(error)) => tracing::debug!(%error, "cannot listen for the serve lease's notifications"),
                    Err(_) => tracing::debug!("no connection to listen for the serve lease's notifications"),
                }
                tokio::time::sleep(pause).await;
            }
        });
        Wakeups { heard, listener }
    }

    /// Waits a poll period, or less when a notification comes first: `true` then.
    async fn pause(&mut self, term: Duration) -> bool {
        tokio::select! {
            () = tokio::time::sleep(period(term)) => false,
            heard = self.heard.changed() => {
                if heard.is_err() {
                    // The listener is gone (it never ends by itself): plain polls.
                    tokio::time::sleep(period(term)).await;
                }
                heard.is_ok()
            }
        }
    }
}

impl Lease {
    /// Waits until this node holds the serve lease of the database at `url`, as a standby
    /// while another node holds it (`waiting` hears each new holder once), then keeps it renewed.
    ///
    /// # Errors
    /// [`LockError::Database`] when the database cannot be reached at all for a whole term.
    pub async fn acquire(
        url: &str,
        identity: NodeIdentity,
        term: Duration,
        connect_timeout: Duration,
        waiting: impl Fn(&Holder) + Send,
    ) -> Result<Lease, LockError> {
        let lessee = Lessee { url: url.to_owned(), identity, term, connect_timeout };
        let mut connection = lessee.connect().await?;
        if let Err(error) = lessee.warn_of_differing_settings(&mut connection).await {
            tracing::debug!(%error, "could not compare this node's settings with the others'");
        }
        let mut last_holder: Option<(String, i64, Option<String>)> = None;
        let mut failing_since: Option<Instant> = None;
        let mut wakeups = Wakeups::start(&lessee);
        let (generation, forward_key) = loop {
            let attempt = async {
                lessee.heartbeat(&mut connection, "standby").await?;
                lessee.try_take(&mut connection).await
            };
            let outcome = tokio::time::timeout(term, attempt).await;
            match outcome {
                Ok(Ok(Ok(Taken { generation, previous, given_up, forward_key }))) => {
                    match previous {
                        Some(previous) if previous.node_id == lessee.identity.node_id => {
                            tracing::info!(generation, "took the serve lease back from this node's previous process")
                        }
                        Some(previous) if given_up => tracing::info!(
                            generation,
                            from = %previous.node_id,
                            from_address = previous.address.as_deref().unwrap_or("unknown"),
                            "took the serve lease over from a node that gave it up (it was stopped)"
                        ),
                        Some(previous) => tracing::info!(
                            generation,
                            from = %previous.node_id,
                            from_address = previous.address.as_deref().unwrap_or("unknown"),
                            lapsed_ms_ago = previous.remaining_ms.saturating_neg(),
                            "took the serve lease over from a node whose term ran out"
                        ),
                        None => tracing::info!(generation, "took the serve lease (nobody held it)"),
                    }
                    break (generation, forward_key);
                }
                Ok(Ok(Err(holder))) => {
                    failing_since = None;
                    let seen = (holder.node_id.clone(), holder.generation, holder.address.clone());
                    if last_holder.as_ref() != Some(&seen) {
                        waiting(&holder);
                        last_holder = Some(seen);
                    }
                }
                failed => {
                    let reason = match failed {
                        Ok(Err(error)) => error.to_string(),
                        _ => format!("no answer within {} ms", term.as_millis()),
                    };
                    let since = *failing_since.get_or_insert_with(Instant::now);
                    // A node that never read the lease gives up (a wrong URL, a database that is
                    // not there); a standby that has read it holds nothing, so it waits out a
                    // database that is slow, restarting or blocked by a lock, and keeps its doors.
                    if last_holder.is_none() && since.elapsed() >= term.max(lessee.connect_timeout) {
                        return Err(lessee.fail(reason));
                    }
                    tracing::warn!(reason, "cannot read the serve lease; trying again");
                    match lessee.connect().await {
                        Ok(fresh) => connection = fresh,
                        Err(error) => tracing::warn!(%error, "cannot reach the database; trying again"),
                    }
                }
            }
            if wakeups.pause(term).await {
                tracing::info!("heard that the serve lease changed hands; reading it now");
            }
        };
        drop(wakeups);
        // Renewal deadlines count from now: the take-over set the term on the database's clock
        // after this moment had passed on ours.
        let taken_at = Instant::now();
        let (lost_tx, lost_rx) = watch::channel(None);
        let fence = Arc::new(Fence {
            holder: lessee.identity.node_id.clone(),
            generation,
            idle_timeout_ms: lessee.term.as_millis().to_string(),
            lost: lost_tx,
        });
        let (release_tx, release_rx) = oneshot::channel();
        let (abort_tx, abort_rx) = oneshot::channel::<()>();
        let holder = lessee.identity.node_id.clone();
        // The renewals run on a thread and a runtime of their own, with a connection of their
        // own: a node whose async workers are busy for a while (a huge model answer parsed, a
        // test's single-threaded runtime) still renews on time, and only a node that is stopped,
        // cut off or frozen lets its lease lapse.
        drop(connection);
        let url = redact(&lessee.url);
        let keeper_fence = fence.clone();
        let span = tracing::info_span!("serve_lease", generation);
        std::thread::Builder::new()
            .name("nexus-serve-lease".to_owned())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(runtime) => runtime,
                    Err(error) => {
                        keeper_fence.lose(format!("cannot start the serve lease's renewals: {error}"));
                        return;
                    }
                };
                let keep = async move {
                    tokio::select! {
                        () = hold(lessee, None, generation, taken_at, keeper_fence, release_rx) => {}
                        _ = abort_rx => {}
                    }
                };
                runtime.block_on(tracing::Instrument::instrument(keep, span));
            })
            .map_err(|error| LockError::Database {
                url,
                reason: format!("cannot start the serve lease's renewals: {error}"),
            })?;
        Ok(Lease {
            holder,
            generation,
            forward_key,
            fence,
            lost: lost_rx,
            release: Some(release_tx),
            abort: Some(abort_tx),
        })
    }

    /// The fence the store's writer checks ([`super::Store::fence_with`]).
    pub fn fence(&self) -> Arc<Fence> {
        self.fence.clone()
    }

    /// A receiver that holds `Some(reason)` once the lease is lost.
    pub(super) fn lost(&self) -> watch::Receiver<Option<String>> {
        self.lost.clone()
    }

    /// Gives the lease up (a standby hears it on [`LEASE_CHANNEL`] and takes it at once, or at its
    /// next poll) and marks this node's row `stopped`.
    pub async fn release(&mut self) {
        let Some(release) = self.release.take() else { return };
        let (done_tx, done_rx) = oneshot::channel();
        if release.send(done_tx).is_ok() {
            let _ = done_rx.await;
        }
    }
}

/// Renews the lease every [`period`] until released, or until it is lost: renewal finds another
/// holder, or no renewal succeeded for a whole term.
async fn hold(
    lessee: Lessee,
    mut connection: Option<PgConnection>,
    generation: i64,
    taken_at: Instant,
    fence: Arc<Fence>,
    mut release: oneshot::Receiver<oneshot::Sender<()>>,
) {
    // The lease runs out a term after the last renewal sent that then succeeded.
    let mut valid_until = taken_at + lessee.term;
    let mut ticks = tokio::time::interval(period(lessee.term));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut lost_changes = fence.lost.subscribe();
    loop {
        tokio::select! {
            asked = &mut release => {
                if let Some(connection) = connection.as_mut() {
                    let give_up = async {
                        // The holder stays named, its term ended: the next holder takes over
                        // at once and can say from whom; the node is listed as stopped.
                        sqlx::query("UPDATE cluster_lease SET lease_until_ms = 0 \
                                     WHERE name = 'serve' AND holder = $1 AND generation = $2")
                            .bind(&lessee.identity.node_id)
                            .bind(generation)
                            .execute(&mut *connection)
                            .await?;
                        notify(&mut *connection, &lessee.identity.node_id).await?;
                        sqlx::query("UPDATE cluster_nodes SET role = 'stopped' WHERE node_id = $1")
                            .bind(&lessee.identity.node_id)
                            .execute(&mut *connection)
                            .await
                    };
                    match tokio::time::timeout(lessee.term, give_up).await {
                        Ok(Ok(_)) => tracing::info!("gave the serve lease up"),
                        Ok(Err(error)) => tracing::warn!(%error, "cannot give the serve lease up; it lapses by itself"),
                        Err(_) => tracing::warn!("no answer giving the serve lease up; it lapses by itself"),
                    }
                }
                if let Some(connection) = connection.take() {
                    let _ = tokio::time::timeout(lessee.term, connection.close()).await;
                }
                if let Ok(done) = asked {
                    let _ = done.send(());
                }
                return;
            }
            _ = lost_changes.changed() => {
                // A write found the lease gone: nothing to renew.
                return;
            }
            _ = ticks.tick() => {
                let sent = Instant::now();
                let left = valid_until.saturating_duration_since(sent);
                if left.is_zero() {
                    let reason = format!("could not renew the serve lease within its term of {} ms", lessee.term.as_millis());
                    tracing::error!(reason, "this node stops driving work");
                    fence.lose(reason);
                    return;
                }
                let attempt = async {
                    let connection = match connection.as_mut() {
                        Some(connection) => connection,
                        None => connection.insert(lessee.connect().await.map_err(|e| e.to_string())?),
                    };
                    lessee.renew(connection, generation).await.map_err(|e| e.to_string())
                };
                let outcome = tokio::time::timeout(left, attempt).await;
                match outcome {
                    Ok(Ok(true)) => valid_until = sent + lessee.term,
                    Ok(Ok(false)) => {
                        let reason = "another node took the serve lease over".to_owned();
                        tracing::error!(reason, "this node stops driving work");
                        fence.lose(reason);
                        return;
                    }
                    Ok(Err(error)) => {
                        tracing::warn!(%error, left_ms = left.as_millis(), "cannot renew the serve lease; trying again");
                        connection = None;
                    }
                    Err(_) => {
                        connection = None;
                    }
                }
            }
        }
    }
}

/// The serve lease as the store holds it (`GET /agent_api/v1/cluster`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LeaseRow {
    /// The node holding it, if any.
    pub holder: Option<String>,
    /// Take-overs so far (0 before any node took it).
    pub generation: i64,
    /// When the holder took it, Unix milliseconds (database clock).
    pub acquired_at_ms: i64,
    /// When it lapses unless renewed, Unix milliseconds (database clock).
    pub lease_until_ms: i64,
    /// Milliseconds until it lapses (negative: lapsed that long ago).
    pub remaining_ms: i64,
}

/// One node as `cluster_nodes` holds it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct NodeRow {
    /// The node id (its data dir's `node-id`).
    pub node_id: String,
    /// The address its doors listen on.
    pub address: String,
    /// The host it runs on.
    pub host: String,
    /// Its process id.
    pub pid: i64,
    /// `active` (it held the lease at its last heartbeat) or `standby`.
    pub role: String,
    /// Its `[cluster] lease_ms` (0: written by an older nexus).
    pub lease_ms: i64,
    /// Its `[providers]` table's digest ([`NodeIdentity::with_settings`]; empty: written by an
    /// older nexus).
    pub providers_digest: String,
    /// When this process started serving or waiting, Unix milliseconds (database clock).
    pub started_at_ms: i64,
    /// Milliseconds since its last heartbeat (database clock).
    pub heartbeat_age_ms: i64,
}

impl super::Store {
    /// The serve lease and the nodes that heartbeat on this database, oldest first; nodes
    /// silent for an hour are dropped from the table. Empty on SQLite, which one node serves.
    ///
    /// # Errors
    /// [`super::StoreError::Database`] when the database fails.
    pub async fn cluster(&self) -> super::StoreResult<(Option<LeaseRow>, Vec<NodeRow>)> {
        if self.backend() != super::StoreBackend::Postgres {
            return Ok((None, Vec::new()));
        }
        sqlx::query(concat!("DELETE FROM cluster_nodes WHERE heartbeat_at_ms < ", now_ms!(), " - 3600000"))
            .execute(self.direct_writer())
            .await?;
        let lease = sqlx::query(concat!(
            "SELECT holder, generation, acquired_at_ms, lease_until_ms, lease_until_ms - ",
            now_ms!(),
            " AS remaining_ms FROM cluster_lease WHERE name = 'serve'"
        ))
        .fetch_optional(self.reader())
        .await?
        .map(|row| -> super::StoreResult<LeaseRow> {
            Ok(LeaseRow {
                holder: row.try_get("holder")?,
                generation: row.try_get("generation")?,
                acquired_at_ms: row.try_get("acquired_at_ms")?,
                lease_until_ms: row.try_get("lease_until_ms")?,
                remaining_ms: row.try_get("remaining_ms")?,
            })
        })
        .transpose()?;
        let nodes = sqlx::query(concat!(
            "SELECT node_id, address, host, pid, role, lease_ms, providers_digest, started_at_ms, ",
            now_ms!(),
            " - heartbeat_at_ms AS heartbeat_age_ms FROM cluster_nodes ORDER BY started_at_ms, node_id"
        ))
        .fetch_all(self.reader())
        .await?
        .iter()
        .map(|row| -> super::StoreResult<NodeRow> {
            Ok(NodeRow {
                node_id: row.try_get("node_id")?,
                address: row.try_get("address")?,
                host: row.try_get("host")?,
                pid: row.try_get("pid")?,
                role: row.try_get("role")?,
                lease_ms: row.try_get("lease_ms")?,
                providers_digest: row.try_get("providers_digest")?,
                started_at_ms: row.try_get("started_at_ms")?,
                heartbeat_age_ms: row.try_get("heartbeat_age_ms")?,
            })
        })
        .collect::<super::StoreResult<Vec<_>>>()?;
        Ok((lease, nodes))
    }

    /// Executions that have not ended (`pending`, `running`, `paused`, `needs_attention`,
    /// `canceling`): the work the lease holder drives.
    ///
    /// # Errors
    /// [`super::StoreError::Database`] when the database fails.
    pub async fn live_execution_count(&self) -> super::StoreResult<i64> {
        let count: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM executions WHERE status NOT IN ('completed', 'canceled')")
                .fetch_one(self.reader())
                .await?;
        Ok(count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ADDRESS: &str = "127.0.0.1:7740";

    fn id_of(dir: &Path) -> String {
        NodeIdentity::of(dir, ADDRESS.to_owned()).expect("identity").node_id
    }

    #[test]
    fn a_node_keeps_its_id_and_a_copied_data_dir_takes_its_own() {
        let root = tempfile::tempdir().expect("dir");
        let (first, copy) = (root.path().join("first"), root.path().join("copy"));
        std::fs::create_dir(&first).expect("dir");
        std::fs::create_dir(&copy).expect("dir");
        let id = id_of(&first);
        assert!(uuid::Uuid::parse_str(&id).is_ok(), "{id}");
        assert_eq!(id_of(&first), id, "a restart keeps the id");

        // A copy of the data dir (its node-id file with it) is another node.
        std::fs::copy(first.join("node-id"), copy.join("node-id")).expect("copy");
        let copied = id_of(&copy);
        assert_ne!(copied, id, "a copied data dir passed for the node it was copied from");
        assert_eq!(id_of(&copy), copied, "the copy keeps its new id");
        assert_eq!(id_of(&first), id, "the original keeps its id");

        // A file written before the origin was recorded keeps its id and gains the origin.
        let legacy = uuid::Uuid::new_v4().to_string();
        std::fs::write(first.join("node-id"), format!("{legacy}\n")).expect("write");
        assert_eq!(id_of(&first), legacy);
        let text = std::fs::read_to_string(first.join("node-id")).expect("read");
        assert_eq!(text.lines().count(), 2, "{text}");

        // Garbage is replaced by a fresh id.
        std::fs::write(first.join("node-id"), "garbage\n").expect("write");
        let fresh = id_of(&first);
        assert!(uuid::Uuid::parse_str(&fresh).is_ok() && fresh != legacy, "{fresh}");
    }
}
