//! The Agent API's gRPC door as a suite calls it: a connected client and bearer-authorized
//! requests.

use tonic::transport::{Channel, Endpoint};

use nexus_proto::agent::v1::agent_service_client::AgentServiceClient;

use crate::server::{Minted, TestServer};

/// An `AgentService` client connected to `server`.
///
/// # Panics
/// When the server's URL is malformed or the connection fails.
pub async fn agent_client(server: &TestServer) -> AgentServiceClient<Channel> {
    let channel = Endpoint::from_shared(server.url()).expect("url").connect().await.expect("connect");
    AgentServiceClient::new(channel)
}

/// `message` as a request carrying `member`'s bearer token.
pub fn authed<T>(message: T, member: &Minted) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert("authorization", format!("Bearer {}", member.token).parse().expect("header"));
    request
}
