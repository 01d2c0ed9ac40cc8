//! Step 4, the call sent on: to Stripe with the real secret key, the path,
//! query and body exactly as they came (what was metered is what is sent).
//! No transaction is open meanwhile.

use std::time::Instant;

use bytes::Bytes;

use super::{
    call::Request,
    upstream::{Upstream, UpstreamError, UpstreamResponse},
};

#[tracing::instrument(level = "debug", skip_all)]
pub async fn forward(
    upstream: &Upstream,
    request: &Request,
    body: Bytes,
) -> Result<UpstreamResponse, UpstreamError> {
    let path_and_query = request
        .uri
        .path_and_query()
        .map_or(request.uri.path(), |pq| pq.as_str());
    let started = Instant::now();
    let outcome = upstream
        .forward(&request.method, path_and_query, &request.headers, body)
        .await;
    crate::metrics::upstream_answered(started.elapsed());
    outcome
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use axum::{
        http::{header, HeaderMap, HeaderValue, Method, Uri},
        routing::any,
        Router,
    };

    use super::*;
    use crate::proxy::upstream::StripeSecret;

    fn request(method: Method, uri: &str) -> Request {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer vk_test_vault"),
        );
        headers.insert("idempotency-key", HeaderValue::from_static("order-1"));
        headers.insert("x-private", HeaderValue::from_static("not for stripe"));
        Request {
            method,
            uri: uri.parse::<Uri>().unwrap(),
            headers,
            body: Ok(Bytes::new()),
        }
    }

    #[tokio::test]
    async fn the_call_goes_on_with_the_real_key_and_what_stripe_acts_on() {
        // Stripe's stand-in answers with what it was sent.
        let echo = Router::new().fallback(any(
            |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| async move {
                let header = |name: &str| {
                    headers
                        .get(name)
                        .map_or("-", |v| v.to_str().unwrap())
                        .to_owned()
                };
                format!(
                    "{method} {uri} {} {} {} {}",
                    header("authorization"),
                    header("idempotency-key"),
                    header("x-private"),
                    String::from_utf8_lossy(&body)
                )
            },
        ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, echo).await });
        let secret = Some(StripeSecret::new("sk_test_real".into()));
        let upstream = Upstream::new(&base, secret, Duration::from_secs(5)).unwrap();

        let read = forward(
            &upstream,
            &request(Method::GET, "/v1/charges/ch_1?expand[]=customer"),
            Bytes::new(),
        )
        .await
        .unwrap();
        assert_eq!(
            read.body,
            "GET /v1/charges/ch_1?expand[]=customer Bearer sk_test_real order-1 - "
        );
        let write = forward(
            &upstream,
            &request(Method::POST, "/v1/charges"),
            Bytes::from("amount=5"),
        )
        .await
        .unwrap();
        assert_eq!(
            write.body,
            "POST /v1/charges Bearer sk_test_real order-1 - amount=5"
        );
    }

    #[tokio::test]
    async fn a_call_that_never_left_is_known_not_sent() {
        // Nothing listens on the discard port.
        let secret = Some(StripeSecret::new("sk_test_real".into()));
        let upstream = Upstream::new("http://127.0.0.1:9", secret, Duration::from_secs(5)).unwrap();
        let outcome = forward(
            &upstream,
            &request(Method::POST, "/v1/charges"),
            Bytes::new(),
        )
        .await;
        assert!(matches!(outcome, Err(UpstreamError::NotSent(_))));
    }
}
