//! `ip_allow` and `ip_deny`: let in, or keep out, visitors by address range.
//!
//! Both read [`RequestContext::client_ip`], the one visitor address the server computed
//! (the TCP peer, or the `X-Forwarded-For` walk when the peer is a trusted proxy; see
//! [`crate::http::forwarded`]), never a header of their own. A refused visitor gets a
//! 403 page.

use http::{Request, StatusCode};

use super::{BoxFuture, Flow, Middleware, RequestContext};
use crate::http::Body;
use crate::http::forwarded::{Cidr, any_contains};
use crate::http::page::error_page;

/// Whether the listed ranges are the only ones let in, or the ones kept out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// `ip_allow`: only addresses in the ranges pass.
    Allow,
    /// `ip_deny`: addresses in the ranges are refused.
    Deny,
}

/// The `ip_allow` / `ip_deny` middleware.
#[derive(Debug, Clone)]
pub struct IpFilter {
    rule: Rule,
    ranges: Vec<Cidr>,
}

impl IpFilter {
    /// A filter applying `rule` to `ranges`. An `Allow` filter with no ranges refuses
    /// everyone (the config refuses to build one).
    pub fn new(rule: Rule, ranges: Vec<Cidr>) -> IpFilter {
        IpFilter { rule, ranges }
    }

    /// Whether a visitor from `address` may pass.
    pub fn admits(&self, address: std::net::IpAddr) -> bool {
        let listed = any_contains(&self.ranges, address);
        match self.rule {
            Rule::Allow => listed,
            Rule::Deny => !listed,
        }
    }
}

impl Middleware for IpFilter {
    fn name(&self) -> &str {
        match self.rule {
            Rule::Allow => "ip_allow",
            Rule::Deny => "ip_deny",
        }
    }

    fn on_request<'a>(
        &'a self,
        _request: &'a mut Request<Body>,
        cx: &'a mut RequestContext,
    ) -> BoxFuture<'a, Flow> {
        let flow = if self.admits(cx.client_ip) {
            Flow::Continue
        } else {
            cx.decide(self.name(), format!("refused {}", cx.client_ip));
            Flow::Respond(error_page(
                StatusCode::FORBIDDEN,
                "Forbidden",
                &format!(
                    "{} does not accept visitors from your address ({}). If you should have access, ask the site's operator to allow it.",
                    cx.host, cx.client_ip
                ),
            ))
        };
        Box::pin(std::future::ready(flow))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::middleware::testing::{body_text, context_from, get, run};

    fn ranges(list: &[&str]) -> Vec<Cidr> {
        list.iter()
            .map(|text| text.parse().expect("valid"))
            .collect()
    }

    #[tokio::test]
    async fn allow_lets_only_listed_ranges_in() {
        let filter = IpFilter::new(Rule::Allow, ranges(&["10.0.0.0/8", "2001:db8::/32"]));
        assert_eq!(filter.name(), "ip_allow");
        for address in ["10.1.2.3", "2001:db8::5", "::ffff:10.0.0.1"] {
            let mut cx = context_from(address.parse().expect("ip"));
            assert!(
                run(&filter, &mut get("/"), &mut cx).await.is_none(),
                "{address}"
            );
        }
        let mut cx = context_from("198.51.100.1".parse().expect("ip"));
        let response = run(&filter, &mut get("/"), &mut cx).await.expect("refused");
        assert_eq!(response.status(), StatusCode::FORBIDDEN);
        assert_eq!(
            cx.decisions,
            [("ip_allow".into(), "refused 198.51.100.1".into())]
        );
        assert!(
            body_text(response)
                .await
                .contains("example.com does not accept")
        );
    }

    #[tokio::test]
    async fn deny_keeps_listed_ranges_out() {
        let filter = IpFilter::new(Rule::Deny, ranges(&["198.51.100.0/24"]));
        assert_eq!(filter.name(), "ip_deny");
        let mut cx = context_from("198.51.100.77".parse().expect("ip"));
        let response = run(&filter, &mut get("/"), &mut cx).await.expect("refused");
        assert_eq!(response.status(), StatusCode::FORBIDDEN);
        let mut cx = context_from("198.51.101.1".parse().expect("ip"));
        assert!(run(&filter, &mut get("/"), &mut cx).await.is_none());
    }
}
