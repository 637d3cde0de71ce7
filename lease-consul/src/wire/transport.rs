//! The HTTP client requests go through: the crate's own, counting its connections, or the
//! application's.

use std::time::Duration;

use reqwest::{Method, StatusCode, Url};

use super::answer::consul_index;
use super::pool::Pool;
use lease_core::BoxError;
use lease_http::{ApiError, ClientConfig};

/// The HTTP client requests go through.
#[derive(Clone, Debug)]
pub(crate) enum HttpClient {
    /// Built here: its connector counts connections, so at most `config.max_connections`
    /// are ever open (see the `pool` module); `config` builds it again for another runtime.
    Counted {
        pool: Box<Pool>,
        config: ClientConfig,
    },
    /// The application's own ([`ConsulBuilder::http_client`](super::ConsulBuilder::http_client)).
    Given(reqwest::Client),
}

impl HttpClient {
    /// The client `config` describes.
    pub(crate) fn build(config: ClientConfig) -> Result<HttpClient, BoxError> {
        Ok(HttpClient::Counted {
            pool: Box::new(Pool::new(&config)?),
            config,
        })
    }

    /// Whether this client's connections are counted, so the budget may use every one of them
    /// for requests (else one is kept for the pool's connect race).
    pub(super) fn counts_connections(&self) -> bool {
        matches!(self, HttpClient::Counted { .. })
    }

    /// The same client on a connection pool of its own, if this crate built it.
    pub(super) fn rebuilt(&self) -> Option<HttpClient> {
        match self {
            HttpClient::Counted { config, .. } => HttpClient::build(config.clone()).ok(),
            HttpClient::Given(client) => Some(HttpClient::Given(client.clone())),
        }
    }

    /// Sends one request and reads its whole answer.
    pub(super) async fn send(
        &self,
        method: Method,
        url: Url,
        token: Option<&str>,
        body: Option<Vec<u8>>,
        timeout: Duration,
    ) -> Result<(StatusCode, Option<u64>, Vec<u8>), ApiError> {
        let client = match self {
            HttpClient::Counted { pool, .. } => {
                return pool
                    .send(method, &url, token, body, timeout)
                    .await
                    .map_err(ApiError::pool);
            }
            HttpClient::Given(client) => client,
        };
        let mut request = client.request(method, url).timeout(timeout);
        if let Some(token) = token {
            request = request.header("X-Consul-Token", token);
        }
        if let Some(body) = body {
            request = request.body(body);
        }
        let response = request.send().await.map_err(ApiError::transport)?;
        let status = response.status();
        let index = consul_index(response.headers());
        let bytes = response.bytes().await.map_err(ApiError::transport)?;
        Ok((status, index, bytes.to_vec()))
    }
}
