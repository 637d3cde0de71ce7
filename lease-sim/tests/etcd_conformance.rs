//! The public conformance suite (`lease-conformance`) run by the real lease-etcd client against
//! the etcd model (served on a 127.0.0.1 port, one model per scenario), with the harness of
//! `tests/tests/conformance.rs`'s real etcd: no lock-delay and no release of a key apart from its
//! lease. The operator acts on the model directly: a revoked lease, a key (and its contenders)
//! deleted, the leases left counted.
//!
//! Run: `cargo test -p lease-sim --test etcd_conformance`.

use lease_conformance::{Capability, Harness, Operator, OperatorError};
use lease_core::BoxFuture;
use lease_etcd::Etcd;
use lease_sim::etcd::{Config, Model};
use tokio::net::TcpListener;

/// The model's operator: `etcdctl lease revoke`, `etcdctl del <key>` and `--prefix <key>/`.
struct ModelOperator(Model);

impl Operator for ModelOperator {
    fn destroy_session<'a>(&'a self, holder: &'a str) -> BoxFuture<'a, Result<(), OperatorError>> {
        Box::pin(async move {
            let hex = holder.split('_').next().unwrap_or_default();
            let revoked = i64::from_str_radix(hex, 16).is_ok_and(|id| self.0.revoke_lease(id));
            if revoked {
                Ok(())
            } else {
                Err(OperatorError::NotFound {
                    what: "lease",
                    name: holder.to_owned(),
                })
            }
        })
    }

    fn delete_key<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), OperatorError>> {
        Box::pin(async move {
            self.0.delete_key(key);
            self.0.delete_prefix(&format!("{key}/"));
            Ok(())
        })
    }

    fn sessions_left(&self) -> BoxFuture<'_, Option<usize>> {
        Box::pin(async { Some(self.0.leases().len()) })
    }
}

async fn model() -> Harness {
    lease_tests::init_tracing();
    let model = Model::new(Config::new(17));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
    let url = format!("http://{}", listener.local_addr().expect("its address"));
    let served = model.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let model = served.clone();
            tokio::spawn(async move {
                let _ = socket.set_nodelay(true);
                let _ = model.serve_connection(socket).await;
            });
        }
    });
    let etcd = Etcd::builder()
        .endpoints([url])
        .build()
        .expect("a valid configuration");
    Harness::new(etcd, ModelOperator(model))
        .lacks(Capability::LockDelay)
        .lacks(Capability::ReleaseKey)
}

lease_conformance::suite!(etcd_model, model);
