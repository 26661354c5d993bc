//! `GET /agent_api/v1/cluster`: the nodes that share this store, the serve lease, and what its
//! holder drives (`docs/cluster.md`).

use std::sync::atomic::Ordering;

use serde_json::{Value, json};

use nexus_proto::Refusal;

use super::{Api, internal};

impl Api {
    /// The Prometheus series of `GET /metrics` in the OpenMetrics text format
    /// ([`crate::metrics::render`], `docs/metrics.md`).
    ///
    /// # Errors
    /// `internal` when the store's census cannot be read.
    pub async fn metrics(&self) -> Result<String, Refusal> {
        crate::metrics::render(&self.fabric).await.map_err(internal)
    }

    /// The cluster listing: `{store, lease_ms, this_node, lease, nodes: [{node_id, address,
    /// host, pid, role, started_at_ms, heartbeat_age_ms, alive, this_node, owns, lease_ms,
    /// providers_digest, settings_match}]}`. `owns` is
    /// `{executions, runner_streams}` for the lease holder (live executions in the store; runner
    /// streams when the holder is this node, else null) and null for a standby. On SQLite the
    /// one node is listed as `active` and `lease` is null.
    ///
    /// # Errors
    /// `internal` when the store fails.
    pub async fn cluster(&self) -> Result<Value, Refusal> {
        let fabric = &self.fabric;
        let store = &fabric.store;
        let (lease, mut nodes) = store.cluster().await.map_err(internal)?;
        let executions = store.live_execution_count().await.map_err(internal)?;
        let streams = fabric.connections.load(Ordering::Relaxed);
        let me = &fabric.node;
        let term = i64::try_from(fabric.config.cluster.lease_ms).unwrap_or(i64::MAX);
        if lease.is_none() {
            nodes = vec![crate::store::lease::NodeRow {
                node_id: me.node_id.clone(),
                address: me.address.clone(),
                host: me.host.clone(),
                pid: i64::from(me.pid),
                role: "active".to_owned(),
                lease_ms: me.lease_ms,
                providers_digest: me.providers_digest.clone(),
                started_at_ms: 0,
                heartbeat_age_ms: 0,
            }];
        }
        let holder = lease.as_ref().and_then(|lease| lease.holder.clone().filter(|_| lease.remaining_ms > 0));
        let listed: Vec<Value> = nodes
            .iter()
            .map(|node| {
                let holds = lease.is_none() || holder.as_deref() == Some(node.node_id.as_str());
                // A holder stopped with SIGTERM marks its row `stopped` as it gives the lease up.
                let alive = node.heartbeat_age_ms <= term && node.role != "stopped";
                // A node silent for a term is neither serving nor waiting: it died or was stopped.
                let role = match (holds, alive) {
                    (true, _) => "active",
                    (false, true) => "standby",
                    (false, false) => "gone",
                };
                let owns = holds.then(|| {
                    let runner_streams = (node.node_id == me.node_id).then_some(streams);
                    json!({"executions": executions, "runner_streams": runner_streams})
                });
                json!({
                    "node_id": node.node_id,
                    "address": node.address,
                    "host": node.host,
                    "pid": node.pid,
                    "role": role,
                    "started_at_ms": (node.started_at_ms > 0).then_some(node.started_at_ms),
                    "heartbeat_age_ms": node.heartbeat_age_ms,
                    "alive": alive,
                    "this_node": node.node_id == me.node_id,
                    "owns": owns,
                    "lease_ms": (node.lease_ms > 0).then_some(node.lease_ms),
                    "providers_digest": (!node.providers_digest.is_empty()).then_some(&node.providers_digest),
                    // Whether it runs with this node's lease_ms and provider table (null: an
                    // older nexus wrote its row, without them).
                    "settings_match": (!node.providers_digest.is_empty()).then(|| {
                        node.lease_ms == me.lease_ms && node.providers_digest == me.providers_digest
                    }),
                })
            })
            .collect();
        Ok(json!({
            "store": store.backend().as_str(),
            "lease_ms": fabric.config.cluster.lease_ms,
            "this_node": me.node_id,
            "lease": lease,
            "nodes": listed,
        }))
    }
}
