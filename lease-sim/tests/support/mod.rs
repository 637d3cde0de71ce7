//! Serving a model on a real loopback port, for the tests that drive the real client at it.

#![allow(dead_code, unreachable_pub)]

use lease_sim::consul::Model;
use tokio::net::TcpListener;

/// Serves `model` on a free `127.0.0.1` port until the runtime ends; returns its URL.
pub async fn serve(model: Model) -> String {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let address = listener.local_addr().expect("a bound address");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let model = model.clone();
            tokio::spawn(async move {
                let _closed_or_reset = model.serve_connection(stream).await;
            });
        }
    });
    format!("http://{address}")
}

/// A client of the model at `url`.
pub fn client(url: &str) -> lease_consul::Consul {
    lease_consul::Consul::builder()
        .address(url)
        .build()
        .expect("a valid client configuration")
}
