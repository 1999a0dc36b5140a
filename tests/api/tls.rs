//! HTTPS with rustls: `--tls-cert` and `--tls-key`.

use reqwest::StatusCode;
use serde_json::json;

use crate::harness::{Instance, migrated_database, rules};

#[tokio::test]
async fn the_service_answers_over_tls_with_the_configured_certificate_only() {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let dir = tempfile::Builder::new()
        .prefix("sf-tmp-")
        .tempdir()
        .unwrap();
    let (cert_path, key_path) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert_path, cert.cert.pem()).unwrap();
    std::fs::write(&key_path, cert.signing_key.serialize_pem()).unwrap();
    let tls = snapfence::tls_config(&cert_path, &key_path).await.unwrap();
    let instance = {
        let database = migrated_database().await;
        Instance::start_with_tls(database.options().clone(), rules(), Some(tls))
            .await
            .owning(database)
    };

    let trusting = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(cert.cert.pem().as_bytes()).unwrap())
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
