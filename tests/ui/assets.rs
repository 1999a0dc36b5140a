//! The page's files over HTTP: each with its media type, the strict policy, `nosniff` and a
//! request id; public, even where the API needs a key; and naming nothing outside this server.

use reqwest::{Method, StatusCode};
use snapfence::domain::Scope;
use snapfence::http::ui::{ASSETS, Asset};

use crate::harness::TestApp;

/// The media type each file must have, decided here from its name rather than read back from
/// the table that serves it.
fn expected_type(asset: &Asset) -> &'static str {
    let path = asset.path;
    if path == "/ui" {
        "text/html; charset=utf-8"
    } else if path.ends_with(".js") {
        "text/javascript; charset=utf-8"
    } else if path.ends_with(".css") {
        "text/css; charset=utf-8"
    } else if path.ends_with(".svg") {
        "image/svg+xml"
    } else {
        panic!("no expected media type for {path}")
    }
}

/// The file in `ui/` that an asset is compiled from.
fn source(asset: &Asset) -> Vec<u8> {
    let name = match asset.path {
        "/ui" => "index.html",
        other => other.strip_prefix("/ui/").unwrap(),
    };
    std::fs::read(format!("{}/ui/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

fn text(asset: &Asset) -> &'static str {
    std::str::from_utf8(asset.body).expect("the page's files are UTF-8")
}

/// The directives of a Content-Security-Policy, by name.
fn directives(policy: &str) -> std::collections::HashMap<&str, Vec<&str>> {
    policy
        .split(';')
        .filter_map(|d| {
            let mut words = d.split_whitespace();
            Some((words.next()?, words.collect()))
        })
        .collect()
}

#[tokio::test]
async fn every_file_is_served_with_its_type_a_strict_policy_nosniff_and_a_request_id() {
    let app = TestApp::spawn().await;
    for asset in &ASSETS {
        for method in [Method::GET, Method::HEAD] {
            let r = app
                .request(method.clone(), asset.path)
                .header("x-request-id", "ui-probe-1")
                .send()
                .await
                .unwrap();
            let what = format!("{method} {}", asset.path);
            assert_eq!(r.status(), StatusCode::OK, "{what}");
            let h = r.headers().clone();
            assert_eq!(h["content-type"], expected_type(asset), "{what}");
            assert_eq!(h["x-content-type-options"], "nosniff", "{what}");
            assert_eq!(h["x-request-id"], "ui-probe-1", "{what}");
            assert_eq!(h["x-frame-options"], "DENY", "{what}");
            assert_eq!(h["referrer-policy"], "no-referrer", "{what}");
            let policy = h["content-security-policy"].to_str().unwrap();
            let d = directives(policy);
            for (name, value) in [
                ("default-src", "'self'"),
                ("script-src", "'self'"),
                ("style-src", "'self'"),
                ("img-src", "'self'"),
                ("connect-src", "'self'"),
                ("object-src", "'none'"),
                ("base-uri", "'none'"),
                ("frame-ancestors", "'none'"),
            ] {
                assert_eq!(
                    d.get(name),
                    Some(&vec![value]),
                    "{what}: {name} in {policy}"
                );
            }
            assert!(
                !policy.contains("unsafe") && !policy.contains('*') && !policy.contains(':'),
                "{what}: nothing inline, no wildcard, no other origin or scheme: {policy}"
            );
            let body = r.bytes().await.unwrap();
            if method == Method::GET {
                assert_eq!(body, source(asset), "{what} is ui/ as compiled in");
            } else {
                assert!(body.is_empty(), "{what} has no body");
            }
        }
    }
    // Without a request id of its own, an answer gets a fresh one, like every answer.
    let r = app.get("/ui").await;
    assert!(!r.headers()["x-request-id"].is_empty());
    app.stop().await;
}

#[tokio::test]
async fn the_page_loads_without_a_key_where_the_api_needs_one() {
    let app = TestApp::spawn().await;
    app.make_key("ops", Scope::Admin, "").await;
    assert_eq!(
        app.get("/v1/leases").await.status(),
        StatusCode::UNAUTHORIZED
    );
    for asset in &ASSETS {
        assert_eq!(
            app.get(asset.path).await.status(),
            StatusCode::OK,
            "{}",
            asset.path
        );
    }
    // A key, even a bad one, changes nothing for the files: they are the same for everyone.
    let r = app
        .request(Method::GET, "/ui")
        .header("Authorization", "Bearer nonsense")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    app.stop().await;
}

#[tokio::test]
async fn only_get_and_head_are_answered_and_nothing_else_under_ui_exists() {
    let app = TestApp::spawn().await;
    let r = app.request(Method::POST, "/ui").send().await.unwrap();
    assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    for path in ["/ui/", "/ui/index.html", "/ui/missing.js"] {
        let r = app.get(path).await;
        assert_eq!(r.status(), StatusCode::NOT_FOUND, "{path}");
        assert_eq!(
            r.headers()["content-type"],
            "application/problem+json",
            "{path}"
        );
    }
    app.stop().await;
}

#[test]
fn the_files_name_nothing_outside_this_server() {
    // The only absolute URL allowed is SVG's namespace name, which is an identifier that no
    // browser fetches.
    const SVG_NAMESPACE: &str = "http://www.w3.org/2000/svg";
    for asset in &ASSETS {
        let body = text(asset).replace(SVG_NAMESPACE, "");
        for absolute in [
            "http:", "https:", "ws:", "wss:", "data:", "blob:", "//cdn", "url(",
        ] {
            assert!(
                !body.contains(absolute),
                "{}: names {absolute:?}: nothing may come from elsewhere",
                asset.path
            );
        }
        assert!(!body.contains("@import"), "{}: no @import", asset.path);
    }
}

#[test]
fn the_page_has_no_inline_script_or_style_and_names_only_served_files() {
    let html = text(&ASSETS[0]);
    assert!(!html.contains("<style"), "no <style> element");
    assert!(!html.contains(" style="), "no style attribute");
    assert!(
        !html
            .split_whitespace()
            .any(|w| w.starts_with("on") && w.contains("=\"")),
        "no inline event handler"
    );
    // Every <script> has a src and no body; every src and href is a served file (relative to
    // /ui, so "ui/app.js" is /ui/app.js) or a fragment of the page itself.
    for script in html.split("<script").skip(1) {
        assert!(script.contains(" src=\""), "a <script> without src");
        let body = script.split_once('>').unwrap().1;
        assert!(body.starts_with("</script>"), "an inline script");
    }
    let served: Vec<&str> = ASSETS.iter().map(|a| a.path).collect();
    for attribute in [" src=\"", " href=\""] {
        for value in html.split(attribute).skip(1) {
            let value = value.split('"').next().unwrap();
            if value.starts_with('#') {
                continue;
            }
            assert!(
                served.contains(&format!("/{value}").as_str()),
                "{attribute}{value}\" is not one of the served files {served:?}"
            );
        }
    }
}

#[test]
fn the_script_calls_only_the_public_v1_api_and_never_builds_markup_from_text() {
    let js = text(ASSETS.iter().find(|a| a.path == "/ui/app.js").unwrap());
    for banned in [
        "innerHTML",
        "outerHTML",
        "insertAdjacentHTML",
        "document.write",
        "eval(",
        "new Function",
        "localStorage",
    ] {
        assert!(!js.contains(banned), "app.js uses {banned}");
    }
    // One fetch, inside the helper that adds the key; every call of the helper names a v1 path.
    assert_eq!(js.matches("fetch(").count(), 1, "one fetch in app.js");
    let calls: Vec<&str> = js.split("await api(").skip(1).collect();
    assert!(calls.len() >= 5, "the views call the API");
    for call in calls {
        assert!(
            call.starts_with("`v1/") || call.starts_with("'v1/"),
            "an API call that is not to v1/: {}",
            &call[..call.len().min(60)]
        );
    }
    // The key is kept for the session only and travels in the Authorization header.
    assert!(js.contains("sessionStorage"));
    assert!(js.contains("`Bearer ${key}`"));
}
