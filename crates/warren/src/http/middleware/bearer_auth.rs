//! `bearer_auth`: a request must carry one of a list of tokens as
//! `Authorization: Bearer TOKEN` (RFC 6750), for APIs and webhooks.
//!
//! Only BLAKE3 hashes of the tokens are kept in memory, and a presented token's hash is
//! compared against every one of them in constant time (no early exit), so neither a
//! memory dump nor response timing gives a token away. Tokens are long random strings,
//! so a plain hash is enough (no password hashing cost). As with `basic_auth`, the header
//! is stripped before forwarding unless `strip = false`.

use std::fmt;

use http::header::{AUTHORIZATION, HeaderValue, WWW_AUTHENTICATE};
use http::{Request, StatusCode};
use subtle::{Choice, ConstantTimeEq};

use super::basic_auth::check_realm;
use super::{BoxFuture, Flow, Middleware, RequestContext};
use crate::http::Body;
use crate::http::page::error_page;

/// The BLAKE3 hash of a bearer token: what the config keeps instead of the token.
#[derive(Clone, PartialEq, Eq)]
pub struct TokenHash([u8; 32]);

impl TokenHash {
    /// The hash of `token`.
    pub fn of(token: &str) -> TokenHash {
        TokenHash(*blake3::hash(token.as_bytes()).as_bytes())
    }
}

impl fmt::Debug for TokenHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TokenHash(****)")
    }
}

/// The `bearer_auth` middleware.
pub struct BearerAuth {
    tokens: Vec<TokenHash>,
    /// `WWW-Authenticate` of a request without a token.
    challenge: HeaderValue,
    /// `WWW-Authenticate` of a request with a wrong or malformed token.
    challenge_invalid: HeaderValue,
    strip: bool,
}

impl BearerAuth {
    /// A `bearer_auth` accepting any of `tokens`, naming `realm` in its challenge.
    ///
    /// # Errors
    /// The realm cannot be sent in a header.
    pub fn new(realm: &str, tokens: Vec<TokenHash>, strip: bool) -> Result<BearerAuth, String> {
        check_realm(realm).map_err(|problem| format!("realm {problem}"))?;
        let header = |text: String| {
            HeaderValue::from_str(&text).map_err(|_| "realm cannot be sent in a header".to_owned())
        };
        Ok(BearerAuth {
            tokens,
            challenge: header(format!("Bearer realm=\"{realm}\""))?,
            challenge_invalid: header(format!(
                "Bearer realm=\"{realm}\", error=\"invalid_token\""
            ))?,
            strip,
        })
    }

    /// Whether `token` is one of ours; every stored hash is compared.
    fn accepts(&self, token: &str) -> bool {
        let presented = TokenHash::of(token);
        let mut found = Choice::from(0);
        for stored in &self.tokens {
            found |= stored.0.ct_eq(&presented.0);
        }
        found.into()
    }
}

impl Middleware for BearerAuth {
    fn name(&self) -> &str {
        "bearer_auth"
    }

    fn on_request<'a>(
        &'a self,
        request: &'a mut Request<Body>,
        cx: &'a mut RequestContext,
    ) -> BoxFuture<'a, Flow> {
        let presented = request.headers().get(AUTHORIZATION).map(|value| {
            value
                .to_str()
                .ok()
                .and_then(|text| text.trim().split_once(' '))
                .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
                .map(|(_, token)| token.trim())
                .filter(|token| !token.is_empty())
                .is_some_and(|token| self.accepts(token))
        });
        let flow = match presented {
            Some(true) => {
                if self.strip {
                    request.headers_mut().remove(AUTHORIZATION);
                }
                cx.decide("bearer_auth", "token accepted");
                Flow::Continue
            }
            refused => {
                let (outcome, challenge) = match refused {
                    None => ("refused: no token", &self.challenge),
                    _ => ("refused: wrong token", &self.challenge_invalid),
                };
                cx.decide("bearer_auth", outcome);
                let mut response = error_page(
                    StatusCode::UNAUTHORIZED,
                    "Token required",
                    &format!(
                        "{} needs a valid token in an `Authorization: Bearer` header. Ask the site's operator for one.",
                        cx.host
                    ),
                );
                response
                    .headers_mut()
                    .insert(WWW_AUTHENTICATE, challenge.clone());
                Flow::Respond(response)
            }
        };
        Box::pin(std::future::ready(flow))
    }
}

impl fmt::Debug for BearerAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BearerAuth")
            .field("tokens", &self.tokens.len())
            .field("strip", &self.strip)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::middleware::testing::{context, get, run};

    const TOKEN: &str = "tok-0123456789abcdef0123";
    const OTHER: &str = "tok-fedcba9876543210fedc";

    fn with_header(value: &str) -> Request<Body> {
        let mut request = get("/api");
        request
            .headers_mut()
            .insert(AUTHORIZATION, HeaderValue::from_str(value).expect("ascii"));
        request
    }

    #[tokio::test]
    async fn any_listed_token_passes() {
        let auth = BearerAuth::new(
            "api",
            vec![TokenHash::of(TOKEN), TokenHash::of(OTHER)],
            true,
        )
        .expect("valid");
        for value in [format!("Bearer {TOKEN}"), format!("bearer  {OTHER} ")] {
            let mut request = with_header(&value);
            let mut cx = context();
            assert!(run(&auth, &mut request, &mut cx).await.is_none(), "{value}");
            assert!(!request.headers().contains_key(AUTHORIZATION));
            assert_eq!(cx.decisions[0].1, "token accepted");
        }
        let kept = BearerAuth::new("api", vec![TokenHash::of(TOKEN)], false).expect("valid");
        let mut request = with_header(&format!("Bearer {TOKEN}"));
        assert!(run(&kept, &mut request, &mut context()).await.is_none());
        assert!(request.headers().contains_key(AUTHORIZATION));
    }

    #[tokio::test]
    async fn missing_or_wrong_tokens_get_401() {
        let auth = BearerAuth::new("api", vec![TokenHash::of(TOKEN)], true).expect("valid");
        let mut cx = context();
        let response = run(&auth, &mut get("/"), &mut cx).await.expect("refused");
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(response.headers()[WWW_AUTHENTICATE], "Bearer realm=\"api\"");
        assert_eq!(cx.decisions[0].1, "refused: no token");
        for value in [
            format!("Bearer {OTHER}"),
            format!("Basic {TOKEN}"),
            "Bearer".to_owned(),
            "Bearer ".to_owned(),
            format!("Bearer {}", &TOKEN[..10]),
        ] {
            let mut cx = context();
            let response = run(&auth, &mut with_header(&value), &mut cx)
                .await
                .expect("refused");
            assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{value}");
            assert_eq!(
                response.headers()[WWW_AUTHENTICATE],
                "Bearer realm=\"api\", error=\"invalid_token\""
            );
        }
        assert_eq!(format!("{:?}", TokenHash::of(TOKEN)), "TokenHash(****)");
    }
}
