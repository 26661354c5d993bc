//! What a standby node answers on its port while another node holds the serve lease
//! (`docs/cluster.md`, "Any node answers"): it passes every request, HTTP or gRPC, on to the
//! holder and streams back its answer ([`Forwarder`]), so runners, clients and load balancers may
//! use any node's address. The gRPC health service answers for the holder then, `SERVING`.
//!
//! When it cannot forward, it refuses with `unavailable` (HTTP 503 with `Retry-After`, gRPC
//! `UNAVAILABLE`), naming the node that serves and its address, and its own health service says
//! `NOT_SERVING`: while no node holds the lease (a take-over is under way), when the holder's row
//! has no address or advertises one with no host (`0.0.0.0:7700`: set its
//! `[cluster] advertise_address`), over TLS, and for a request that was already forwarded once.
//! A runner-agent takes the refusal as it takes a closed connection: it moves to the next node of
//! its list.
//!
//! Nothing here reads the store or a credential: a standby drives no work; the holder checks
//! every credential of a forwarded request.

use axum::Router;
use axum::extract::{Request, State};
use axum::http::Version;
use axum::http::header::{self, HeaderValue};
use axum::response::Response;
use tokio::sync::watch;
use tonic::codegen::Service;
use tonic::service::Routes;
use tonic::transport::server::TcpConnectInfo;
use tonic_health::ServingStatus;

use nexus_proto::{ErrorCode, Refusal};

use crate::doors::forward::{FORWARDED, Forwarder, Target, is_grpc, names_no_host, refusal_response};

/// How long a client is told to wait before it asks again (`Retry-After`), in seconds.
pub const STANDBY_RETRY_AFTER_SECONDS: u64 = 1;

/// The node that holds the serve lease, as a standby last read it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Holder {
    /// The holder's node id.
    pub node_id: String,
    /// Its advertised address (`[cluster] advertise_address`, else its listen address), when
    /// its row says one.
    pub address: Option<String>,
    /// Its forwarding secret of this term (empty: a holder that takes no forwarded request).
    pub forward_key: String,
}

impl Holder {
    /// Where to forward to: `None` when the row has no address, or one with no host, or no key.
    pub fn target(&self) -> Option<Target> {
        let address = self.address.as_ref()?;
        (!names_no_host(address) && !self.forward_key.is_empty()).then(|| Target {
            node_id: self.node_id.clone(),
            address: address.clone(),
            key: self.forward_key.clone(),
        })
    }
}

/// What a standby says, for the node `this_node`, while `holder` serves (`None`: no node holds
/// the lease now, a take-over is under way) and it does not forward the request.
pub fn refusal(this_node: &str, holder: Option<&Holder>) -> Refusal {
    let message = match holder {
        Some(Holder { node_id, address: Some(address), .. }) if names_no_host(address) => {
            format!(
                "this nexus node ({this_node}) is a standby; node {node_id} serves this cluster but advertises {address}, which names no host: set [cluster] advertise_address on it to an address the other nodes and the clients reach"
            )
        }
        Some(Holder { node_id, address: Some(address), .. }) => format!(
            "this nexus node ({this_node}) is a standby; node {node_id} at {address} serves this cluster: send the request there"
        ),
        Some(Holder { node_id, address: None, .. }) => format!(
            "this nexus node ({this_node}) is a standby; node {node_id} serves this cluster (its address is not known here: see GET /agent_api/v1/cluster on it)"
        ),
        None => format!(
            "this nexus node ({this_node}) is a standby and no node serves right now (a take-over is under way): retry in a moment"
        ),
    };
    Refusal { code: ErrorCode::Unavailable, message, retry_after: Some(STANDBY_RETRY_AFTER_SECONDS) }
}

/// What [`refuse`] reads: this node and the holder it last read.
#[derive(Clone)]
struct Refusing {
    this_node: String,
    holder: watch::Receiver<Option<Holder>>,
}

#[derive(Clone)]
struct Standby {
    refusing: Refusing,
    /// `None`: these doors do not forward (TLS).
    forwarder: Option<Forwarder>,
    /// Says why once this node took the lease or is stopping: every forwarded request is cut,
    /// its client told that.
    closing: watch::Receiver<Option<String>>,
    /// What answers a request that is not forwarded: the health service, `NOT_SERVING`, and a
    /// refusal for everything else.
    local: Router,
}

/// The standby's routes: every request forwarded to the holder by `forwarder` when it can be
/// (`None`: never), each cut when `holder` changes or `closing` says why, and otherwise the
/// gRPC health service, `NOT_SERVING` for every service, and a refusal ([`refusal`]), as gRPC
/// (trailers only) for a gRPC request and as the doors' JSON error otherwise.
pub async fn routes(
    this_node: String,
    holder: watch::Receiver<Option<Holder>>,
    forwarder: Option<Forwarder>,
    closing: watch::Receiver<Option<String>>,
) -> Routes {
    let (reporter, health) = tonic_health::server::health_reporter();
    for service in ["", "nexus.runner.v1.RunnerService", "nexus.agent.v1.AgentService"] {
        reporter.set_service_status(service, ServingStatus::NotServing).await;
    }
    let refusing = Refusing { this_node, holder };
    let local = Routes::from(Router::new().fallback(refuse).with_state(refusing.clone()))
        .add_service(health)
        .into_axum_router();
    Routes::from(Router::new().fallback(answer).with_state(Standby { refusing, forwarder, closing, local }))
}

async fn answer(State(mut standby): State<Standby>, request: Request) -> Response {
    // An HTTP/1.1 connection kept alive here would race the take-over: a request sent as the
    // standby's doors close it gets no answer at all. Each one is closed after its answer
    // instead (HTTP/2 has GOAWAY, which tells the client which streams to send again).
    let http1 = request.version() <= Version::HTTP_11;
    // Never to itself: a lease that names this node's own id is one its previous process held.
    // The target and what the cut compares with come from one read of the holder.
    let seen = standby.refusing.holder.borrow_and_update().clone();
    let target = seen.as_ref().filter(|holder| holder.node_id != standby.refusing.this_node).and_then(Holder::target);
    let once = !request.headers().contains_key(FORWARDED);
    let mut response = match (&standby.forwarder, target, once) {
        (Some(forwarder), Some(target), true) => {
            let client = request.extensions().get::<TcpConnectInfo>().and_then(|info| info.remote_addr).map(|a| a.ip());
            // Cut when the holder this request went to is no longer the one this node reads
            // (the old one froze, died or stopped), or when this node takes the lease: the
            // client reconnects, and reaches the node that serves now.
            let (mut holder, mut closing) = (standby.refusing.holder.clone(), standby.closing.clone());
            let cut = Box::pin(async move {
                let changed = async {
                    // Gone (the lease was taken, or this node stops): `closing` says which.
                    if holder.wait_for(|now| *now != seen).await.is_err() {
                        std::future::pending::<()>().await;
                    }
                };
                tokio::select! {
                    () = changed => {
                        "the node that serves this cluster changed: ask again (a follow: from the last cursor you received)"
                            .to_owned()
                    }
                    why = closing.wait_for(Option::is_some) => match why {
                        Ok(why) => why.clone().unwrap_or_default(),
                        Err(_) => "this node's doors closed: ask again".to_owned(),
                    },
                }
            });
            forwarder.forward(request, client, &target, cut).await
        }
        _ => match standby.local.call(request).await {
            Ok(response) => response,
            Err(never) => match never {},
        },
    };
    if http1 {
        response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

async fn refuse(State(refusing): State<Refusing>, request: Request) -> Response {
    let refusal = refusal(&refusing.this_node, refusing.holder.borrow().as_ref());
    refusal_response(refusal, is_grpc(request.headers()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refusal_names_the_serving_node_and_its_address() {
        let holder = Holder { node_id: "n-1".into(), address: Some("10.0.0.1:7700".into()), forward_key: "k".into() };
        let said = refusal("n-2", Some(&holder));
        assert_eq!(said.code, ErrorCode::Unavailable);
        assert_eq!(said.retry_after, Some(STANDBY_RETRY_AFTER_SECONDS));
        assert!(said.message.contains("n-2") && said.message.contains("n-1 at 10.0.0.1:7700"), "{}", said.message);
        let nobody = refusal("n-2", None);
        assert!(nobody.message.contains("take-over"), "{}", nobody.message);
        let anywhere = Holder { address: Some("0.0.0.0:7700".into()), ..holder.clone() };
        let said = refusal("n-2", Some(&anywhere));
        assert!(said.message.contains("advertise_address"), "{}", said.message);
    }

    #[test]
    fn a_standby_forwards_only_to_an_address_with_a_host_and_a_key() {
        let holder = Holder { node_id: "n-1".into(), address: Some("10.0.0.1:7700".into()), forward_key: "k".into() };
        let target = holder.target().expect("forwardable");
        assert_eq!((target.address.as_str(), target.key.as_str()), ("10.0.0.1:7700", "k"));
        assert!(Holder { address: Some("node-1.internal:7700".into()), ..holder.clone() }.target().is_some());
        assert_eq!(Holder { address: Some("0.0.0.0:7700".into()), ..holder.clone() }.target(), None);
        assert_eq!(Holder { address: Some("[::]:7700".into()), ..holder.clone() }.target(), None);
        assert_eq!(Holder { address: None, ..holder.clone() }.target(), None);
        assert_eq!(Holder { forward_key: String::new(), ..holder }.target(), None);
    }
}
