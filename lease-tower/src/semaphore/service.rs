//! [`Semaphore`]: the service, which starts taking a slot in `call` and hands the rest to its
//! response future.

use std::mem;
use std::sync::Arc;
use std::task::{Context, Poll};

use std::borrow::Cow;

use http::{Request, Response};
use lease_core::{Backend, Error, Lease, Wait};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use tower::Service;

use super::config::Config;
use super::future::ResponseFuture;
use crate::body::LeaseBody;

/// Holds one slot of a distributed semaphore per request. Built by [`SemaphoreLayer`](super::SemaphoreLayer); see there
/// and the [module docs](crate::semaphore).
#[derive(Clone, Debug)]
pub struct Semaphore<S> {
    pub(super) inner: S,
    pub(super) config: Arc<Config>,
}

impl<S> Semaphore<S> {
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

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Semaphore<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
{
    type Response = Response<LeaseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The instance that was driven to readiness serves this request; the clone stays behind
        // for the next `poll_ready`.
        let clone = self.inner.clone();
        let inner = mem::replace(&mut self.inner, clone);
        let config = Arc::clone(&self.config);
        let acquire = Box::pin(async move { acquire_slot(&config).await });
        ResponseFuture::acquiring(acquire, inner, request, Arc::clone(&self.config))
    }
}

/// Takes this process's admission permit, then a slot of the distributed semaphore, within the
/// layer's wait in total.
async fn acquire_slot(config: &Config) -> Result<(Lease, OwnedSemaphorePermit), Error> {
    let started = Instant::now();
    let busy = || Error::Busy {
        key: config.spec.key().to_owned(),
        waited: started.elapsed(),
    };
    let local = Arc::clone(&config.local);
    let (permit, spec) = match local.clone().try_acquire_owned() {
        Ok(permit) => (permit, Cow::Borrowed(&*config.spec)),
        Err(_) => match config.spec.wait_policy() {
            Wait::Never => return Err(busy()),
            Wait::Forever => {
                // The gate is never closed; a closed one means the layer is going away.
                let permit = local.acquire_owned().await.map_err(|_| busy())?;
                (permit, Cow::Borrowed(&*config.spec))
            }
            Wait::UpTo(wait) => {
                let permit = tokio::time::timeout(wait, local.acquire_owned())
                    .await
                    .map_err(|_| busy())?
                    .map_err(|_| busy())?;
                let left = wait.saturating_sub(started.elapsed());
                let wait = if left.is_zero() {
                    Wait::Never
                } else {
                    Wait::UpTo(left)
                };
                (permit, Cow::Owned((*config.spec).clone().wait(wait)))
            }
        },
    };
    let lease = config.backend.acquire(&spec).await?;
    Ok((lease, permit))
}
