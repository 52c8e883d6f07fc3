//! Warren's WAN lab: a userspace packet delay line between two network namespaces, for
//! kernels without `tc netem`. Each direction gets random loss, a token-bucket rate, a
//! drop-tail queue and a fixed delay; see `README.md` for use.
//!
//! The library part is what tests and bench use: [`Lab`] brings up a whole lab for a
//! [`Profile`], and [`stats::Report`] is what it reports.

pub mod engine;
pub mod lab;
pub mod line;
pub mod netns;
pub mod profiles;
pub mod stats;
mod sys;
pub mod units;

pub use lab::{ADDR_A, ADDR_B, Lab, LabOptions};
pub use profiles::{PROFILES, Profile};
