//! A model of the Consul agent and servers, as far as lease-consul uses them.
