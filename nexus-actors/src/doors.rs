//! The doors: [`api`] is the one client API that [`grpc`] and [`http`] serve on one port, in
//! plaintext or over [`tls`]; the runner stream enters through [`grpc`] too. Both take their
//! connections from [`accept`], each under the connection rules of [`sockets`]. On several nodes,
//! a standby's doors are [`standby`], which passes requests on to the serving node ([`forward`]).

pub(crate) mod accept;
pub mod api;
pub mod body;
pub mod console;
pub mod forward;
pub mod grpc;
pub mod http;
pub mod sockets;
pub mod standby;
pub mod tls;
