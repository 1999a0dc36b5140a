//! `/ui`: the operator page, compiled in from `ui/`; it calls the `/v1` API with the operator's
//! key.

use axum::http::{HeaderName, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use super::Routes;

/// One compiled-in file of the page.
#[derive(Debug, Clone, Copy)]
pub struct Asset {
    /// The path it is served at.
    pub path: &'static str,
    /// Its media type, as sent in `Content-Type`.
    pub content_type: &'static str,
    /// Its bytes.
    pub body: &'static [u8],
}

macro_rules! asset {
    ($path:literal, $file:literal, $content_type:literal) => {
        Asset {
            path: $path,
            content_type: $content_type,
            body: include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/ui/", $file)),
        }
    };
}

/// Every file of the page; all paths are relative, so it works behind a path-mounting proxy.
pub const ASSETS: [Asset; 4] = [
    asset!("/ui", "index.html", "text/html; charset=utf-8"),
    asset!("/ui/app.js", "app.js", "text/javascript; charset=utf-8"),
    asset!("/ui/app.css", "app.css", "text/css; charset=utf-8"),
    asset!("/ui/favicon.svg", "favicon.svg", "image/svg+xml"),
];

/// This origin only: nothing inline, no frames, plugins or `<base>`, forms only to this origin.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self'; img-src 'self'; connect-src 'self'; object-src 'none'; base-uri 'none'; \
     form-action 'self'; frame-ancestors 'none'";

/// Outside authentication and shedding like `/healthz`: the files are the same for everyone.
pub(super) fn routes() -> Routes {
    ASSETS.iter().fold(Routes::new(), |routes, asset| {
        let asset = *asset;
        routes.route(asset.path, get(move || async move { serve(asset) }))
    })
}

fn serve(asset: Asset) -> Response {
    let headers = [
        (
            header::CONTENT_TYPE,
            HeaderValue::from_static(asset.content_type),
        ),
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CONTENT_SECURITY_POLICY),
        ),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
        (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
        (
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        ),
        // `no-cache`, so an upgraded server never runs with the old script.
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        (
            HeaderName::from_static("cross-origin-resource-policy"),
            HeaderValue::from_static("same-origin"),
        ),
    ];
    (headers, asset.body).into_response()
}
