//! [`Kind`]: which attribute is being expanded, and what each takes.

/// Which attribute is being expanded.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Leader,
    Semaphore,
}

impl Kind {
    pub(crate) fn attribute(self) -> &'static str {
        match self {
            Kind::Leader => "#[leader_only]",
            Kind::Semaphore => "#[semaphore]",
        }
    }

    /// The named arguments this attribute accepts, in the order the docs list them.
    pub(super) fn accepted(self) -> &'static [&'static str] {
        match self {
            Kind::Leader => &[
                "key",
                "wait",
                "ttl",
                "lock_delay",
                "min_hold",
                "max_run",
                "backend",
                "crate",
            ],
            Kind::Semaphore => &[
                "name",
                "limit",
                "wait",
                "ttl",
                "lock_delay",
                "min_hold",
                "max_run",
                "backend",
                "crate",
            ],
        }
    }

    /// A complete example, for errors about a missing or malformed argument.
    pub(crate) fn example(self) -> &'static str {
        match self {
            Kind::Leader => "#[leader_only(key = \"jobs/compact\")]",
            Kind::Semaphore => "#[semaphore(name = \"reports\", limit = 3)]",
        }
    }

    /// The arguments that may be given without a name, in order.
    pub(super) fn positional(self) -> &'static [&'static str] {
        match self {
            Kind::Leader => &["key"],
            Kind::Semaphore => &["name", "limit"],
        }
    }
}
