//! A small Stripe stand-in for faults no real fake produces on demand:
//! declines, 500s and answers slower than the proxy's timeout, chosen by the
//! `customer` parameter. It records what reached it, so tests can check
//! what the proxy forwarded (and what it did not).

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{
    body::Bytes,
    extract::State,
    http::{HeaderMap, Method, StatusCode, Uri},
    response::IntoResponse,
    routing::any,
    Json, Router,
};
use serde_json::json;

use crate::helpers::REAL_STRIPE_KEY;

/// One request as the fake received it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub authorization: String,
    pub idempotency_key: Option<String>,
    pub stripe_version: Option<String>,
    pub body: String,
}

#[derive(Clone, Default)]
pub struct FakeStripe {
    pub base: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl FakeStripe {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let fake = Self {
            base: format!("http://{}", listener.local_addr().unwrap()),
            ..Self::default()
        };
        let app = Router::new()
            .route("/v1/{*rest}", any(answer))
            .with_state(fake.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        fake
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

async fn answer(
    State(fake): State<FakeStripe>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> impl IntoResponse {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let body = String::from_utf8_lossy(&body).into_owned();
    let number = {
        let mut seen = fake.seen.lock().unwrap();
        seen.push(Seen {
            method: method.to_string(),
            path: uri.path().to_owned(),
            authorization: header("authorization").unwrap_or_default(),
            idempotency_key: header("idempotency-key"),
            stripe_version: header("stripe-version"),
            body: body.clone(),
        });
        seen.len()
    };
    if header("authorization").as_deref() != Some(&format!("Bearer {REAL_STRIPE_KEY}")) {
        let error = json!({ "error": { "type": "invalid_request_error", "message": "Invalid API Key provided" } });
        return (StatusCode::UNAUTHORIZED, Json(error)).into_response();
    }
    let params: Vec<(String, String)> = form_urlencoded::parse(body.as_bytes())
        .into_owned()
        .collect();
    let param = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    match param("customer").as_deref() {
        Some("cus_decline") => {
            let error = json!({ "error": { "type": "card_error", "code": "card_declined", "message": "Your card was declined." } });
            (StatusCode::PAYMENT_REQUIRED, Json(error)).into_response()
        }
        Some("cus_500") => (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(json!({ "error": { "type": "api_error" } })),
        )
            .into_response(),
        Some("cus_slow") => {
            tokio::time::sleep(Duration::from_secs(5)).await;
            (StatusCode::OK, Json(json!({ "id": "ch_late" }))).into_response()
        }
        _ => {
            let charge = json!({ "id": format!("ch_fake{number}"), "object": "charge", "amount": param("amount") });
            ([("request-id", format!("req_fake{number}"))], Json(charge)).into_response()
        }
    }
}
