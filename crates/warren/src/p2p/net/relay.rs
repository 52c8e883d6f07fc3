//! TEMPORARY SCAFFOLD (not committed): the helper's relay API, for compiling.
#![allow(missing_docs, unused)]
use std::net::SocketAddr;
use std::time::Duration;
use super::StunIo;
pub struct RelayToken([u8; 32]);
impl RelayToken { pub fn from_key(k: &crate::p2p::pake::DerivedKey) -> RelayToken { RelayToken(*k.expose()) } }
pub struct RelayAuth([u8;32]);
impl RelayAuth { pub fn from_psk(_p: &crate::crypto::secret::Secret) -> RelayAuth { RelayAuth([0;32]) } }
#[derive(Debug, Clone)] pub struct JoinConfig { pub first_wait: Duration, pub timeout: Duration }
impl Default for JoinConfig { fn default() -> Self { JoinConfig { first_wait: Duration::from_millis(50), timeout: Duration::from_secs(10) } } }
#[derive(Debug, thiserror::Error)] #[error("relay scaffold")] pub struct RelayError;
pub async fn join<S: StunIo>(_io: &mut S, _relay: SocketAddr, _token: &RelayToken, _auth: &RelayAuth, _config: &JoinConfig) -> Result<(), RelayError> { Err(RelayError) }
