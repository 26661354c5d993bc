//! An in-process TCP proxy that can cut every connection through it.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::copy_bidirectional;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Forwards 127.0.0.1:<port> to a target; [`TcpProxy::cut`] drops every live connection.
#[derive(Debug)]
pub struct TcpProxy {
    /// The proxy's address.
    pub addr: SocketAddr,
    links: Arc<Mutex<Vec<JoinHandle<()>>>>,
    acceptor: JoinHandle<()>,
}

impl TcpProxy {
    /// Starts a proxy to `target`.
    pub async fn start(target: SocketAddr) -> TcpProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy addr");
        let links: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let held = links.clone();
        let acceptor = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let _ = inbound.set_nodelay(true);
                let link = tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(target).await else { return };
                    let _ = outbound.set_nodelay(true);
                    let _ = copy_bidirectional(&mut inbound, &mut outbound).await;
                });
                held.lock().expect("links").push(link);
            }
        });
        TcpProxy { addr, links, acceptor }
    }

    /// `http://<proxy addr>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Drops every live connection (both directions at once, like a cut cable with RSTs).
    pub fn cut(&self) -> usize {
        let mut links = self.links.lock().expect("links");
        let count = links.iter().filter(|l| !l.is_finished()).count();
        for link in links.drain(..) {
            link.abort();
        }
        count
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.acceptor.abort();
        self.cut();
    }
}
