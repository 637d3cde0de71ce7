//! [`SequencerCheck`]: the service, which answers from the cache in `call` when it can and leaves
//! a consistent read to its response future when it cannot.

use std::mem;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response, StatusCode};
use lease_core::{Backend, Error, Sequencer};
use tokio::time::Instant;
use tower::Service;

use super::MissingSequencer;
use super::cache::Verdict;
use super::config::Config;
use super::future::{Refusal, ResponseFuture};
use crate::body::LeaseBody;

/// Passes only requests stamped with the current holder's sequencer. Built by
/// [`SequencerCheckLayer`](super::SequencerCheckLayer); see there and the [module docs](crate::fence).
#[derive(Clone, Debug)]
pub struct SequencerCheck<S> {
    pub(super) inner: S,
    pub(super) config: Arc<Config>,
}

impl<S> SequencerCheck<S> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Consumes `self`, returning the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

/// What the header says, before any check with the backend.
enum Stamp {
    Missing,
    Checked(Sequencer),
    Rejected(Refusal),
    Ask(Sequencer),
}

impl<S> SequencerCheck<S> {
    fn read_stamp<ReqBody>(&self, request: &Request<ReqBody>) -> Stamp {
        let config = &self.config;
        let Some(value) = request.headers().get(&config.header) else {
            return Stamp::Missing;
        };
        let parsed = value
            .to_str()
            .map_err(|_| "the value is not visible ASCII".to_owned())
            .and_then(|text| text.parse::<Sequencer>().map_err(|e| e.to_string()));
        let sequencer = match parsed {
            Ok(sequencer) => sequencer,
            Err(reason) => {
                return Stamp::Rejected(Refusal {
                    status: StatusCode::BAD_REQUEST,
                    text: format!(
                        "the {} header is not a sequencer ({reason}); expected <backend>:<index>:<holder>:<key>\n",
                        config.header
                    ),
                });
            }
        };
        if sequencer.key() != config.key() {
            return Stamp::Rejected(Refusal {
                status: StatusCode::CONFLICT,
                text: format!(
                    "the sequencer is for key {:?}; this route accepts work only from the holder of {:?}\n",
                    sequencer.key(),
                    config.key()
                ),
            });
        }
        match config.cache.verdict(&sequencer, config.max_staleness) {
            Verdict::Current => Stamp::Checked(sequencer),
            Verdict::Stale => Stamp::Rejected(stale(&sequencer)),
            Verdict::Unknown => Stamp::Ask(sequencer),
        }
    }
}

pub(super) fn stale(sequencer: &Sequencer) -> Refusal {
    Refusal {
        status: StatusCode::CONFLICT,
        text: format!(
            "stale sequencer {sequencer}: its lease is no longer the current holder of {:?}; the work was refused\n",
            sequencer.key()
        ),
    }
}

/// One consistent read of `sequencer`, bounded by the read timeout; a success is remembered as a
/// fresh answer.
async fn consistent_check(config: Arc<Config>, sequencer: Sequencer) -> Result<(), Refusal> {
    let sent = Instant::now();
    let checked = tokio::time::timeout(
        config.read_timeout,
        config.backend().check_sequencer(&sequencer),
    )
    .await;
    match checked {
        Ok(Ok(())) => {
            config.cache.confirm(&sequencer, sent);
            Ok(())
        }
        Ok(Err(Error::Lost(_))) => Err(stale(&sequencer)),
        Ok(Err(error)) if error.is_transient() => {
            tracing::warn!(%sequencer, %error, "sequencer check: the backend cannot tell; answering 503");
            Err(Refusal {
                status: StatusCode::SERVICE_UNAVAILABLE,
                text: "the lease backend cannot confirm this request's sequencer now; retry after the delay in Retry-After\n".to_owned(),
            })
        }
        Ok(Err(error)) => {
            tracing::error!(%sequencer, %error, "sequencer check: the check cannot be made; answering 500");
            Err(Refusal {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                text: format!(
                    "this route cannot check sequencers of {:?}, and retrying cannot fix it until its operator does\n",
                    config.key()
                ),
            })
        }
        Err(_) => {
            tracing::warn!(%sequencer, timeout = ?config.read_timeout, "sequencer check: the backend did not answer in time; answering 503");
            Err(Refusal {
                status: StatusCode::SERVICE_UNAVAILABLE,
                text: format!(
                    "the lease backend did not confirm this request's sequencer within {:?}, and no answer younger than {:?} is known; retry after the delay in Retry-After\n",
                    config.read_timeout, config.max_staleness
                ),
            })
        }
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for SequencerCheck<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
{
    type Response = Response<LeaseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<ReqBody>) -> Self::Future {
        self.config.cache.ensure_observing();
        match self.read_stamp(&request) {
            Stamp::Missing => match self.config.missing {
                MissingSequencer::Pass => ResponseFuture::running(self.inner.call(request)),
                MissingSequencer::Reject => ResponseFuture::rejected(Refusal {
                    status: StatusCode::PRECONDITION_REQUIRED,
                    text: format!(
                        "this route accepts work only from the current holder of {:?}; send its sequencer in the {} header\n",
                        self.config.key(),
                        self.config.header
                    ),
                }),
            },
            Stamp::Rejected(response) => ResponseFuture::rejected(response),
            Stamp::Checked(sequencer) => {
                request.extensions_mut().insert(sequencer);
                ResponseFuture::running(self.inner.call(request))
            }
            Stamp::Ask(sequencer) => {
                let clone = self.inner.clone();
                let inner = mem::replace(&mut self.inner, clone);
                let check = Box::pin(consistent_check(
                    Arc::clone(&self.config),
                    sequencer.clone(),
                ));
                ResponseFuture::checking(check, sequencer, inner, request, Arc::clone(&self.config))
            }
        }
    }
}
