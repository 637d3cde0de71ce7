//! What a failed Consul call ([`ApiError`]) means to the user: the hints that name Consul's
//! settings, and the public error, saying what the caller was doing (built by the wire client's
//! `ErrorContext`, beside [`ConsulHttp`](super::ConsulHttp), from these hints).
//!
//! A refused or dropped connection and a 429 answer name the agent's connection limit
//! (`limits.http_max_conns_per_client`) and `ConsulBuilder::max_connections`, in the error and
//! in the outage gate's warning; a refused TCP connection still asks whether the agent is
//! running, a name that does not resolve says DNS, and a failed TLS handshake names the TLS
//! settings, each naming the setting the address came from (`CONSUL_HTTP_ADDR` or the builder).

use reqwest::StatusCode;

use super::settings::AddressOrigin;
use lease_http::{ApiError, Cause};

/// What the user should do about `error`, for errors and warnings. It names the setting the
/// agent's address came from (`origin`): `CONSUL_HTTP_ADDR` only if it was read; and over `https`,
/// what an agent that verifies clients does to a client without a certificate.
pub(crate) fn hint(error: &ApiError, origin: AddressOrigin, https: bool) -> &'static str {
    let env = origin.setting() == "CONSUL_HTTP_ADDR";
    let default = matches!(origin, AddressOrigin::Default { .. });
    match error {
        ApiError::Transport(source) => match (Cause::of(&**source), env, default) {
            (Cause::Tls, ..) => TLS_HINT,
            (Cause::Other, ..) if https => {
                "is it running? Check its address; an agent that verifies clients \
                 (verify_incoming) closes the connection of a client without a certificate \
                 (CONSUL_CLIENT_CERT and CONSUL_CLIENT_KEY, or ConsulBuilder::client_cert)"
            }
            (Cause::Refused, true, false) => {
                "is it running? Start an agent, or point CONSUL_HTTP_ADDR at one"
            }
            (Cause::Refused, true, true) => {
                "is it running? Start an agent here, or set CONSUL_HTTP_ADDR to its address"
            }
            (Cause::Refused, false, false) => {
                "is it running? Start an agent, or give ConsulBuilder::address its address"
            }
            (Cause::Refused, false, true) => {
                "is it running? Start an agent here, or give ConsulBuilder::address its address"
            }
            (Cause::Dns, true, _) => {
                "the host name did not resolve (DNS): check CONSUL_HTTP_ADDR and the resolver"
            }
            (Cause::Dns, false, _) => {
                "the host name did not resolve (DNS): check the address given to \
                 ConsulBuilder::address and the resolver"
            }
            (Cause::Dropped, ..) => LIMIT_HINT,
            (Cause::TimedOut, ..) => "no answer in time: the agent or the network is overloaded",
            (Cause::Other, true, _) => "is it running? Check CONSUL_HTTP_ADDR",
            (Cause::Other, false, _) => {
                "is it running? Check the address given to ConsulBuilder::address"
            }
        },
        ApiError::Status {
            status: StatusCode::TOO_MANY_REQUESTS,
            ..
        } => LIMIT_HINT,
        ApiError::Status { .. } | ApiError::Malformed(_) => "",
        ApiError::TimedOut => "no answer in time: the agent or the network is overloaded",
    }
}

/// What to check when the TLS handshake with the agent fails.
const TLS_HINT: &str = "the TLS handshake failed: trust the CA that signed the agent's certificate \
    (CONSUL_CACERT, or ConsulBuilder::ca_cert), connect by a name the certificate carries or set \
    that name (CONSUL_TLS_SERVER_NAME, or ConsulBuilder::tls_server_name), and give a client \
    certificate if the agent verifies clients (CONSUL_CLIENT_CERT and CONSUL_CLIENT_KEY, or \
    ConsulBuilder::client_cert)";

/// What to change when the agent refuses or drops connections.
pub(super) const LIMIT_HINT: &str = "the agent refused or dropped the connection: it allows each client IP \
    `limits.http_max_conns_per_client` connections (default 200), shared by every process on \
    this host; raise that limit in the agent's configuration, or lower \
    `ConsulBuilder::max_connections` (default 8) of the processes here";

#[cfg(test)]
mod tests {
    use lease_core::ErrorKind;
    use lease_http::ErrorContext;

    use super::*;

    fn answer(status: u16, message: &str) -> ApiError {
        ApiError::Status {
            status: StatusCode::from_u16(status).expect("a status code"),
            grpc_code: None,
            message: message.to_owned(),
        }
    }

    /// What Consul (1.8.7) answers while it elects a leader, restarts or is overloaded is
    /// transient, in the public error a campaign judges: a campaign never ends on it.
    /// Permissions, bad requests and unreadable answers are not.
    #[test]
    fn server_trouble_is_transient_and_nothing_else() {
        let consul = crate::Consul::builder()
            .address("http://127.0.0.1:1")
            .build()
            .expect("a client");
        let refused = || {
            ApiError::pool(Box::new(std::io::Error::from(
                std::io::ErrorKind::ConnectionRefused,
            )))
        };
        // (what Consul answers, its kind, transient)
        let table = [
            (answer(500, "No cluster leader"), ErrorKind::Backend, true),
            (
                answer(500, "rpc error making call: No cluster leader"),
                ErrorKind::Backend,
                true,
            ),
            (
                answer(500, "rpc error making call: rpc error making call: EOF"),
                ErrorKind::Backend,
                true,
            ),
            (
                answer(500, "No known Consul servers"),
                ErrorKind::Backend,
                true,
            ),
            (answer(502, "Bad Gateway"), ErrorKind::Backend, true),
            (answer(503, "Service Unavailable"), ErrorKind::Backend, true),
            (answer(504, "Gateway Timeout"), ErrorKind::Backend, true),
            (
                answer(
                    429,
                    "Your IP is issuing too many concurrent connections, please rate limit your calls",
                ),
                ErrorKind::Backend,
                true,
            ),
            (refused(), ErrorKind::Unreachable, true),
            (ApiError::TimedOut, ErrorKind::Backend, true),
            (
                answer(403, "Permission denied"),
                ErrorKind::PermissionDenied,
                false,
            ),
            (
                answer(400, "Request decode failed"),
                ErrorKind::Backend,
                false,
            ),
            (answer(404, ""), ErrorKind::Backend, false),
            (
                ApiError::Malformed("not JSON".into()),
                ErrorKind::Backend,
                false,
            ),
        ];
        for (error, kind, transient) in table {
            let what = error.to_string();
            let public = consul.client().wire().public_error(error, "acquire \"k\"");
            assert_eq!(
                (public.kind(), public.is_transient()),
                (kind, transient),
                "{what}: {public}"
            );
        }
    }
}
