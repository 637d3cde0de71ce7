//! lease-conformance's suite, every scenario, run by the real lease-consul client against the
//! Consul model (as `tests/tests/conformance.rs` runs it against a dev agent): the model must
//! be good enough for everything the client is held to. Each scenario serves a fresh model on
//! a loopback port, on real time.

mod support;

use lease_conformance::{Harness, Operator, OperatorError};
use lease_core::BoxFuture;
use lease_sim::consul::{Config, Model};

/// The model's operator actions, as the agent's operator HTTP calls are for a real Consul.
struct ModelOperator(Model);

impl Operator for ModelOperator {
    fn destroy_session<'a>(&'a self, holder: &'a str) -> BoxFuture<'a, Result<(), OperatorError>> {
        // Consul answers true for a session that is gone; so does the agent's operator.
        self.0.destroy_session(holder);
        Box::pin(std::future::ready(Ok(())))
    }

    fn delete_key<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), OperatorError>> {
        self.0.delete_key(key);
        Box::pin(std::future::ready(Ok(())))
    }

    fn release_key<'a>(
        &'a self,
        key: &'a str,
        holder: &'a str,
    ) -> BoxFuture<'a, Result<(), OperatorError>> {
        let released = if self.0.release_key(key, holder) {
            Ok(())
        } else {
            Err(OperatorError::NotFound {
                what: "lock held by that session on",
                name: key.to_owned(),
            })
        };
        Box::pin(std::future::ready(released))
    }

    fn sessions_left(&self) -> BoxFuture<'_, Option<usize>> {
        Box::pin(std::future::ready(Some(self.0.sessions().len())))
    }
}

async fn model() -> Harness {
    let model = Model::new(Config::new(35));
    let url = support::serve(model.clone()).await;
    Harness::new(support::client(&url), ModelOperator(model))
}

lease_conformance::suite!(consul_model, model);
