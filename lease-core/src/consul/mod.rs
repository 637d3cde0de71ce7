//! Consul backend (in progress).
