//! Forwarding to Stripe with the real secret key: bytes in, bytes out.

use std::{fmt, time::Duration};

use axum::http::{HeaderMap, HeaderName, Method, StatusCode};
use bytes::Bytes;

/// The real Stripe secret key. Never printed, never sent anywhere but to
/// the upstream.
#[derive(Clone)]
pub struct StripeSecret(String);

impl StripeSecret {
    pub fn new(secret: String) -> Self {
        Self(secret)
    }
}

impl fmt::Debug for StripeSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("StripeSecret(…)")
    }
}

/// Request headers a Stripe SDK sends that Stripe acts on: passed through
/// byte for byte.
const FORWARDED_REQUEST_HEADERS: [&str; 6] = [
    "content-type",
    "idempotency-key",
    "stripe-version",
    "stripe-account",
    "user-agent",
    "x-stripe-client-user-agent",
];

/// Response headers a client may rely on.
const FORWARDED_RESPONSE_HEADERS: [&str; 6] = [
    "content-type",
    "request-id",
    "idempotency-key",
    "original-request",
    "stripe-version",
    "stripe-should-retry",
];

use crate::stripe_events::WebhookSecrets;

#[derive(Clone)]
pub struct Upstream {
    client: reqwest::Client,
    base: String,
    secret: Option<StripeSecret>,
    timeout: Duration,
    /// What Stripe signs the events it sends back with.
    webhook_secrets: WebhookSecrets,
}

/// What came back from Stripe.
pub struct UpstreamResponse {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// Why no answer came back.
#[derive(Debug)]
pub enum UpstreamError {
    /// The request never left (connection refused, DNS): safe to release.
    NotSent(String),
    /// It may have reached Stripe (timeout, reset mid-call): outcome unknown.
    Unknown(String),
}

impl Upstream {
    pub fn new(
        base: &str,
        secret: Option<StripeSecret>,
        timeout: Duration,
    ) -> anyhow::Result<Self> {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(10)))
            .build()?;
        Ok(Self {
            client,
            base: base.trim_end_matches('/').to_owned(),
            secret,
            timeout,
            webhook_secrets: WebhookSecrets::default(),
        })
    }

    /// Takes Stripe's webhook events signed with one of `secrets`.
    pub fn with_webhook_secrets(self, secrets: WebhookSecrets) -> Self {
        Self {
            webhook_secrets: secrets,
            ..self
        }
    }

    pub fn webhook_secrets(&self) -> &WebhookSecrets {
        &self.webhook_secrets
    }

    /// How long a process answers for a call it sent: two upstream
    /// requests (a declined payment intent is cancelled before its call
    /// settles) and time to settle. A pending call older than this was
    /// abandoned.
    pub fn lease(&self) -> Duration {
        2 * self.timeout + Duration::from_secs(10)
    }

    pub fn is_configured(&self) -> bool {
        self.secret.is_some()
    }

    /// A typed Stripe client on the same base and key, for the
    /// reconciliation sync; `None` without a key.
    pub fn stripe_client(
        &self,
        options: &crate::reconcile::sync::SyncOptions,
    ) -> Option<stripe::Client> {
        let secret = self.secret.as_ref()?;
        crate::reconcile::sync::client(&self.base, &secret.0, options)
            .inspect_err(|err| tracing::error!(error = %err, "no Stripe client for reconciliation"))
            .ok()
    }

    #[tracing::instrument(skip_all, fields(method = %method, path = path_and_query))]
    pub async fn forward(
        &self,
        method: &Method,
        path_and_query: &str,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<UpstreamResponse, UpstreamError> {
        let secret = self
            .secret
            .as_ref()
            .ok_or_else(|| UpstreamError::NotSent("no STRIPE_SECRET_KEY".into()))?;
        let mut request = self
            .client
            .request(method.clone(), format!("{}{}", self.base, path_and_query))
            .bearer_auth(&secret.0)
            .body(body);
        for name in FORWARDED_REQUEST_HEADERS {
            for value in headers.get_all(name) {
                request = request.header(name, value);
            }
        }
        let response = request.send().await.map_err(classify)?;
        let status = response.status();
        let mut forwarded = HeaderMap::new();
        for name in FORWARDED_RESPONSE_HEADERS {
            if let Some(value) = response.headers().get(name) {
                forwarded.insert(HeaderName::from_static(name), value.clone());
            }
        }
        let body = response
            .bytes()
            .await
            .map_err(|err| UpstreamError::Unknown(err.to_string()))?;
        Ok(UpstreamResponse {
            status,
            headers: forwarded,
            body,
        })
    }
}

fn classify(err: reqwest::Error) -> UpstreamError {
    if err.is_connect() {
        UpstreamError::NotSent(err.to_string())
    } else {
        UpstreamError::Unknown(err.to_string())
    }
}
