//! HTTPS with rustls: `--tls-cert` and `--tls-key`.

use reqwest::StatusCode;
use serde_json::json;

use crate::harness::{https_instance, rules};

#[tokio::test]
async fn the_service_answers_over_tls_with_the_configured_certificate_only() {
    let (instance, cert) = https_instance(rules()).await;

    let trusting = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(cert.as_bytes()).unwrap())
        .build()
        .unwrap();
    let r = trusting
        .post(format!("{}/v1/leases/k", instance.base))
        .json(&json!({"owner": "w", "ttl_ms": 30000}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);

    let plain = instance.base.replace("https://", "http://");
    assert!(
        reqwest::get(format!("{plain}/healthz")).await.is_err(),
        "no plain HTTP on a TLS port"
    );
    let untrusting = reqwest::Client::new();
    let r = untrusting
        .get(format!("{}/healthz", instance.base))
        .send()
        .await;
    assert!(
        r.is_err(),
        "a certificate the client does not trust is refused"
    );
    instance.stop().await;
}
