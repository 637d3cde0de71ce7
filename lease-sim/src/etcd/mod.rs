//! A model of an etcd server, as far as lease-etcd uses it.
