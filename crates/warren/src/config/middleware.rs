//! Stub until the middleware work lands.

use serde::Deserialize;

use super::error::Report;

/// A middleware table (stub).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct FileMiddleware {}

/// A middleware (stub).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MiddlewareSpec;

/// Parses a chain (stub).
pub fn parse_chain(
    _report: &mut Report,
    _key: &str,
    _file: &[FileMiddleware],
) -> Vec<MiddlewareSpec> {
    Vec::new()
}
