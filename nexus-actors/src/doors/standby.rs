//! What a standby node answers on its port while another node holds the serve lease
//! (`docs/cluster.md`, "The serve lease"): every request, HTTP or gRPC, is refused with
//! `unavailable` (HTTP 503 with `Retry-After`, gRPC `UNAVAILABLE`), and the message names the
//! node that serves and its address, so a person with curl, a client given one node's URL, or a
//! load balancer probing the gRPC health service (`NOT_SERVING` here) finds the node to use. A
//! runner-agent takes the refusal as it took the closed connections of earlier standbys: it moves
//! to the next node of its list.
//!
//! Nothing here reads the store or a credential: a standby drives no work and answers nothing
//! but where the work is.

use axum::Router;
use axum::extract::{Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use tokio::sync::watch;
use tonic::service::Routes;
use tonic_health::ServingStatus;

use nexus_proto::{ErrorCode, Refusal};

use crate::doors::http::HttpRefusal;

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
}

/// What a standby says, for the node `this_node`, while `holder` serves (`None`: no node holds
/// the lease now, a take-over is under way).
pub fn refusal(this_node: &str, holder: Option<&Holder>) -> Refusal {
    let message = match holder {
        Some(Holder { node_id, address: Some(address) }) => format!(
            "this nexus node ({this_node}) is a standby; node {node_id} at {address} serves this cluster: send the request there"
        ),
        Some(Holder { node_id, address: None }) => format!(
            "this nexus node ({this_node}) is a standby; node {node_id} serves this cluster (its address is not known here: see GET /agent_api/v1/cluster on it)"
        ),
        None => format!(
            "this nexus node ({this_node}) is a standby and no node serves right now (a take-over is under way): retry in a moment"
        ),
    };
    Refusal { code: ErrorCode::Unavailable, message, retry_after: Some(STANDBY_RETRY_AFTER_SECONDS) }
}

#[derive(Clone)]
struct Standby {
    this_node: String,
    holder: watch::Receiver<Option<Holder>>,
}

/// The standby's routes: the gRPC health service, `NOT_SERVING` for every service, and a
/// refusal for everything else ([`refusal`]), as gRPC (trailers only) for a gRPC request and as
/// the doors' JSON error otherwise.
pub async fn routes(this_node: String, holder: watch::Receiver<Option<Holder>>) -> Routes {
    let (reporter, health) = tonic_health::server::health_reporter();
    for service in ["", "nexus.runner.v1.RunnerService", "nexus.agent.v1.AgentService"] {
        reporter.set_service_status(service, ServingStatus::NotServing).await;
    }
    let router = Router::new().fallback(refuse).with_state(Standby { this_node, holder });
    Routes::from(router).add_service(health)
}

async fn refuse(State(standby): State<Standby>, request: Request) -> Response {
    let refusal = refusal(&standby.this_node, standby.holder.borrow().as_ref());
    let grpc = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("application/grpc"));
    if grpc {
        return refusal.to_status().into_http::<axum::body::Body>();
    }
    let http1 = request.version() <= axum::http::Version::HTTP_11;
    let mut response = HttpRefusal(refusal).into_response();
    // An HTTP/1.1 connection kept alive here would race the take-over: a request sent as the
    // standby's doors close it gets no answer at all. Each one is closed after its answer
    // instead (HTTP/2 has GOAWAY, which tells the client which streams to send again).
    if http1 {
        response.headers_mut().insert(header::CONNECTION, header::HeaderValue::from_static("close"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refusal_names_the_serving_node_and_its_address() {
        let holder = Holder { node_id: "n-1".into(), address: Some("10.0.0.1:7700".into()) };
        let said = refusal("n-2", Some(&holder));
        assert_eq!(said.code, ErrorCode::Unavailable);
        assert_eq!(said.retry_after, Some(STANDBY_RETRY_AFTER_SECONDS));
        assert!(said.message.contains("n-2") && said.message.contains("n-1 at 10.0.0.1:7700"), "{}", said.message);
        let nobody = refusal("n-2", None);
        assert!(nobody.message.contains("take-over"), "{}", nobody.message);
    }
}
