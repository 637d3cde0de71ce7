//! Consul sessions: created per lease, kept alive while it lives, destroyed when it ends.
//!
//! A session is kept alive by the process's heartbeat check (`keepalive`, the default) or by
//! renewing its own TTL (`KeepAlive::SessionTtl`). Either way, the loop that keeps it alive is
//! where this crate self-fences. For renewals: Consul promises
//! not to invalidate a session before its TTL has passed since the last renewal the servers
//! processed. A renewal we *sent* at time T and saw succeed was processed after T, so the session
//! is safe until at least T + TTL. If no renewal succeeds, the loop gives the session up at
//! T + TTL − margin on our own clock, whatever the network does, so the work is cancelled before
//! Consul could hand the lease to someone else.

mod end;
mod hold;
mod life;
mod released;

pub(crate) use end::{Renewals, SessionEnd};
pub(crate) use hold::{SessionLock, judged, start_lease};
pub(crate) use life::Session;
pub(crate) use released::{Holding, ReleasedSessions};
