//! What a wire client is configured with: the ACL token, where the address came from, and the
//! rest of the builder's settings the requests need.

use std::fmt;

/// An ACL token: sent as a header, never displayed.
#[derive(Clone)]
pub(crate) struct Token(pub(crate) String);

impl Token {
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// Where a client's agent address came from, so that a message names what the user set, and
/// never `CONSUL_HTTP_ADDR` for an address that did not come from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AddressOrigin {
    /// `CONSUL_HTTP_ADDR`, read by [`crate::ConsulBuilder::from_env`].
    Env,
    /// [`crate::ConsulBuilder::address`].
    Builder,
    /// Neither: the default `127.0.0.1:8500`. `from_env` if [`crate::ConsulBuilder::from_env`] found
    /// `CONSUL_HTTP_ADDR` unset.
    Default {
        /// Whether the environment was read.
        from_env: bool,
    },
}

impl AddressOrigin {
    /// The setting a user changes to give another address.
    pub(crate) fn setting(self) -> &'static str {
        match self {
            AddressOrigin::Env | AddressOrigin::Default { from_env: true } => "CONSUL_HTTP_ADDR",
            AddressOrigin::Builder | AddressOrigin::Default { from_env: false } => {
                "ConsulBuilder::address"
            }
        }
    }
}

/// What a client is configured with, beyond its address and HTTP client.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    pub(crate) token: Option<Token>,
    pub(crate) datacenter: Option<String>,
    pub(crate) namespace: Option<String>,
    /// The TLS server name requests' URLs name instead of the address's host.
    pub(crate) server_name: Option<String>,
    pub(crate) node_checks: Option<Vec<String>>,
    pub(crate) max_connections: usize,
    /// Where the address came from, for hints.
    pub(crate) origin: AddressOrigin,
    /// Whether the address gives the port (else the scheme's default was assumed).
    pub(crate) port_given: bool,
}
