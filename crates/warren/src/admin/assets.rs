//! The dashboard's static files, embedded in the binary: no build step, nothing fetched
//! from elsewhere. What each file is: `ui/README.md`.

use axum::extract::Path;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

/// One embedded file: its name under `/assets/`, media type and bytes.
struct Asset {
    name: &'static str,
    media_type: &'static str,
    bytes: &'static [u8],
}

const HTML: &str = "text/html; charset=utf-8";

/// Every file served under `/assets/`.
const ASSETS: &[Asset] = &[
    Asset {
        name: "app.js",
        media_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("ui/app.js"),
    },
    Asset {
        name: "app.css",
        media_type: "text/css; charset=utf-8",
        bytes: include_bytes!("ui/app.css"),
    },
    Asset {
        name: "uplot.min.js",
        media_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("ui/uplot.min.js"),
    },
    Asset {
        name: "uplot.min.css",
        media_type: "text/css; charset=utf-8",
        bytes: include_bytes!("ui/uplot.min.css"),
    },
    Asset {
        name: "favicon.svg",
        media_type: "image/svg+xml",
        bytes: include_bytes!("ui/favicon.svg"),
    },
];

/// The dashboard's page (`/`).
pub async fn index() -> Response {
    page(include_bytes!("ui/index.html"))
}

/// The login page (`/login`).
pub fn login_page() -> Response {
    page(include_bytes!("ui/login.html"))
}

fn page(bytes: &'static [u8]) -> Response {
    ([(header::CONTENT_TYPE, HTML)], bytes).into_response()
}

/// `/assets/{name}`.
pub async fn asset(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|asset| asset.name == name) {
        // Embedded with the binary: a new version is a new process, so a short cache with
        // revalidation is safe and spares reloading ~100 KB on every page load.
        Some(asset) => (
            [
                (header::CONTENT_TYPE, asset.media_type),
                (header::CACHE_CONTROL, "private, max-age=300"),
            ],
            asset.bytes,
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "no such asset").into_response(),
    }
}

/// Total bytes of the embedded files (the budget is 150 KB).
pub fn total_bytes() -> usize {
    ASSETS.iter().map(|a| a.bytes.len()).sum::<usize>()
        + include_bytes!("ui/index.html").len()
        + include_bytes!("ui/login.html").len()
}

#[cfg(test)]
mod tests {
    #[test]
    fn assets_stay_within_their_budget() {
        let total = super::total_bytes();
        assert!(total <= 150 * 1024, "dashboard assets are {total} bytes");
    }
}
