//! The connection pool of the clients this crate builds: at most `max` connections open to the
//! agent, counted from connect to close.
//!
//! A pool that counts requests cannot count connections: hyper's pool races a new connection
//! against a connection coming free, and when the free one wins, the new one is still finished
//! and parked. A few such races at once and a process holds more connections than requests
//! (seen: nine against a budget of eight). Here the connector itself holds one permit of `max`
//! per connection, taken before it connects and given back when the connection closes, so a
//! race waits for a permit instead of opening a connection past the budget
//! (`never_more_connections_than_the_budget`: fifty requests at once through three
//! connections).
//!
//! Idle connections stay open: closing one and opening another a moment later made the agent
//! count both at once.
//!
//! TLS (rustls or native-tls, lease-http's `tls` module) runs over a counted connection, so it
//! stays within the budget too.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use reqwest::{Method, StatusCode, Url};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use lease_core::BoxError;
use lease_http::dial::Dial;
use lease_http::tls::{Stream, Tls};
use lease_http::{ClientConfig, DEFAULT_CONNECT_TIMEOUT, Executor};

/// An HTTP client whose connections never exceed its budget.
#[derive(Clone, Debug)]
pub(crate) struct Pool {
    client: Client<Connector, Full<Bytes>>,
}

impl Pool {
    /// A pool of at most `config.max_connections` connections, made as `config` says. Fails if
    /// its TLS settings do not make a TLS configuration (a file that is not PEM, say).
    pub(crate) fn new(config: &ClientConfig) -> Result<Pool, BoxError> {
        let max = config.max_connections;
        let tls = if config.https {
            Tls::new(config, "http/1.1")?
        } else {
            None
        };
        let connector = Connector {
            tls,
            permits: Arc::new(Semaphore::new(max)),
            connect_to: config.connect_to.clone().map(Arc::new),
            timeout: config.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT),
            dial: config.dialer(),
        };
        // Idle connections stay open until the agent closes them. Closing one after a minute
        // unused and opening another a moment later (for a burst, or when the pool's clean-up
        // met the watches' thirty-second turn) made the agent count both at once: 12 against a
        // budget of 8 in a five-minute hold of 10,000 leases. Eight idle connections cost less.
        let client = Client::builder(Executor)
            .pool_idle_timeout(None)
            .pool_max_idle_per_host(max)
            .build(connector);
        Ok(Pool { client })
    }

    /// Sends one request and reads its whole answer, all within `timeout`.
    pub(crate) async fn send(
        &self,
        method: Method,
        url: &Url,
        token: Option<&str>,
        body: Option<Vec<u8>>,
        timeout: Duration,
    ) -> Result<(StatusCode, Option<u64>, Vec<u8>), BoxError> {
        let mut request = hyper::Request::builder().method(method).uri(url.as_str());
        if let Some(token) = token {
            request = request.header("X-Consul-Token", token);
        }
        let request = request.body(Full::new(Bytes::from(body.unwrap_or_default())))?;
        let exchange = async {
            let response = self.client.request(request).await?;
            let status = response.status();
            let index = super::answer::consul_index(response.headers());
            let bytes = response.into_body().collect().await?.to_bytes();
            Ok::<_, BoxError>((status, index, bytes.to_vec()))
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .unwrap_or_else(|_| {
                Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no answer within the request timeout",
                )
                .into())
            })
    }
}

/// Opens a connection once it holds a permit of the budget.
#[derive(Clone, Debug)]
struct Connector {
    /// For an `https` address (the builder refuses one in a build without TLS).
    tls: Option<Tls>,
    permits: Arc<Semaphore>,
    /// Where to connect instead of the URL's host.
    connect_to: Option<Arc<(String, u16)>>,
    timeout: Duration,
    dial: Arc<dyn Dial>,
}

impl tower_service::Service<hyper::Uri> for Connector {
    type Response = TokioIo<Counted>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<TokioIo<Counted>>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: hyper::Uri) -> Self::Future {
        let connector = self.clone();
        Box::pin(async move {
            let permit = Arc::clone(&connector.permits)
                .acquire_owned()
                .await
                .map_err(|_| io::Error::other("the connection pool was closed"))?;
            // The URL's host is the TLS server name; `connect_to` may send the connection
            // elsewhere. A pool has TLS exactly when its address is `https`.
            let name = lease_core::address::bare_host(uri.host().unwrap_or_default());
            let (host, port) = match &connector.connect_to {
                Some(target) => (target.0.as_str(), target.1),
                None => {
                    let default = if connector.tls.is_some() { 443 } else { 80 };
                    (name, uri.port_u16().unwrap_or(default))
                }
            };
            let connect = async {
                let tcp = connector.dial.dial(host, port).await?;
                match &connector.tls {
                    None => Ok(Stream::Plain(tcp)),
                    Some(tls) => tls.connect(name, tcp).await,
                }
            };
            let stream = tokio::time::timeout(connector.timeout, connect)
                .await
                .unwrap_or_else(|_| {
                    Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "connecting (TCP and TLS) took longer than {:?}",
                            connector.timeout
                        ),
                    ))
                })?;
            Ok(TokioIo::new(Counted {
                stream,
                _permit: permit,
            }))
        })
    }
}

/// A connection and its permit, given back when the connection closes.
#[derive(Debug)]
struct Counted {
    stream: Stream,
    _permit: OwnedSemaphorePermit,
}

impl Connection for Counted {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// A server that answers every request after `delay`, counting the connections open to it.
    async fn slow_server(delay: Duration) -> (Url, Arc<(AtomicUsize, AtomicUsize)>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = Url::parse(&format!(
            "http://{}/v1/x",
            listener.local_addr().expect("addr")
        ))
        .expect("url");
        let open = Arc::new((AtomicUsize::new(0), AtomicUsize::new(0)));
        let counts = Arc::clone(&open);
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let counts = Arc::clone(&counts);
                let now = counts.0.fetch_add(1, Ordering::SeqCst) + 1;
                counts.1.fetch_max(now, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buf = [0; 1024];
                    while let Ok(n) = socket.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        request.extend_from_slice(&buf[..n]);
                        while let Some(end) = request.windows(4).position(|w| w == b"\r\n\r\n") {
                            request.drain(..end + 4);
                            tokio::time::sleep(delay).await;
                            let answer = b"HTTP/1.1 200 OK\r\nX-Consul-Index: 7\r\n\
                                           Content-Length: 2\r\n\r\nok";
                            if socket.write_all(answer).await.is_err() {
                                break;
                            }
                        }
                    }
                    counts.0.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        (url, open)
    }

    /// Fifty requests at once through a pool of three: every one is answered, and the server
    /// never sees more than three connections, however the pool's connect races go.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn never_more_connections_than_the_budget() {
        let (url, counts) = slow_server(Duration::from_millis(5)).await;
        let pool = Pool::new(&ClientConfig {
            max_connections: 3,
            ..ClientConfig::default()
        })
        .expect("pool");
        for _round in 0..3 {
            let requests = (0..50).map(|_| {
                let (pool, url) = (pool.clone(), url.clone());
                tokio::spawn(async move {
                    pool.send(Method::GET, &url, None, None, Duration::from_secs(30))
                        .await
                })
            });
            for request in requests.collect::<Vec<_>>() {
                let (status, index, body) = request.await.expect("task").expect("answered");
                assert_eq!(
                    (status, index, body.as_slice()),
                    (StatusCode::OK, Some(7), &b"ok"[..])
                );
            }
        }
        let peak = counts.1.load(Ordering::SeqCst);
        assert!(peak <= 3, "{peak} connections were open at once");
        assert!(
            peak >= 2,
            "the requests were not concurrent ({peak} connection)"
        );
    }

    /// A refused connection says so, as an `io::Error` the hints recognise.
    #[tokio::test]
    async fn a_refused_connection_is_recognised() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = Url::parse(&format!(
            "http://{}/v1/x",
            listener.local_addr().expect("addr")
        ))
        .expect("url");
        drop(listener);
        let pool = Pool::new(&ClientConfig {
            max_connections: 4,
            ..ClientConfig::default()
        })
        .expect("pool");
        let error = pool
            .send(Method::GET, &url, None, None, Duration::from_secs(5))
            .await
            .expect_err("nothing listens");
        assert!(matches!(
            lease_http::Cause::of(&*error),
            lease_http::Cause::Refused
        ));
    }
}
