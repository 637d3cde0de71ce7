//! [`Outcome`]: how a scenario ended, when it did not panic.

use crate::Capability;

/// How a scenario ended, when it did not panic.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The scenario ran and every assertion held.
    Passed,
    /// The harness declares that the backend lacks these capabilities, which the scenario needs,
    /// so it did not run; the refusal of each was checked instead, where the contract defines
    /// one (see [`Capability`]).
    NotApplicable(Vec<Capability>),
}
